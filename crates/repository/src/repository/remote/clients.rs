//! Repository URLs and the object-store clients they name, with Triton's schemes and credential
//! variables:
//!
//! - `s3://bucket/prefix`: S3 or an S3-compatible server, from the usual AWS variables
//!   (`AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`, `AWS_REGION` / `AWS_DEFAULT_REGION`,
//!   `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, ...). A plain `http://`
//!   endpoint is allowed (a local server); path-style requests are the default. Triton's form
//!   with the server in the URL, `s3://[http://|https://]host:port/bucket/prefix` (plain HTTP
//!   unless `https://` is written), names the endpoint instead of the variables.
//! - `gs://bucket/prefix`: Google Cloud Storage, with `GOOGLE_APPLICATION_CREDENTIALS` (a service
//!   account or authorized-user JSON file, as Triton reads it), else `GOOGLE_SERVICE_ACCOUNT` /
//!   `GOOGLE_SERVICE_ACCOUNT_KEY`, else gcloud's default credentials file, else the metadata
//!   server (GCE, GKE workload identity).
//! - `as://account/container/prefix`: Azure Blob Storage, with Triton's `AZURE_STORAGE_KEY` (the
//!   account's shared key) or any `AZURE_*` setting of the client (a SAS token, a service
//!   principal, managed identity); `AZURE_STORAGE_USE_EMULATOR=true` talks to Azurite at
//!   `AZURITE_BLOB_STORAGE_URL` (default `http://127.0.0.1:10000`).
//!
//! `TRITON_CLOUD_CREDENTIAL_PATH`, Triton's credential file, wins over these variables for the
//! URLs it has an entry for (see [`credentials`]).
//!
//! Every client fails a call within seconds when its endpoint is down (a few retries, a 5 s
//! connect timeout) but gives one object's download up to 600 s; `*_CONNECT_TIMEOUT` /
//! `*_TIMEOUT` variables of each cloud override those.

use super::super::store::{plain_relative, StoreError};
use super::credentials::{self, Credential};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::{ClientConfigKey, ObjectStore, RetryConfig};
use std::sync::Arc;
use std::time::Duration;

/// Which object store a repository URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    S3,
    Gcs,
    Azure,
}

impl Cloud {
    fn name(self) -> &'static str {
        match self {
            Cloud::S3 => "S3",
            Cloud::Gcs => "GCS",
            Cloud::Azure => "Azure",
        }
    }
}

/// A parsed repository URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    pub cloud: Cloud,
    /// S3: the server the URL names (`http://host:port`), instead of the environment's.
    pub endpoint: Option<String>,
    /// Azure's storage account (empty for the other clouds).
    pub account: String,
    /// The bucket (Azure: the container).
    pub bucket: String,
    /// The repository's prefix in the bucket, without slashes at either end (empty: the root).
    pub prefix: String,
}

impl RemoteUrl {
    /// A name for the repository's local cache directory.
    pub fn cache_name(&self) -> String {
        if self.account.is_empty() {
            self.bucket.clone()
        } else {
            format!("{}-{}", self.account, self.bucket)
        }
    }
}

/// `Some` when `location` is an `s3://`, `gs://` or `as://` URL, `None` for anything else.
///
/// # Errors
/// [`StoreError::Invalid`]: a URL without its bucket (or account and container), or whose prefix
/// is not a plain relative path.
pub fn parse_url(location: &str) -> Option<Result<RemoteUrl, StoreError>> {
    let (cloud, rest) = [
        ("s3://", Cloud::S3),
        ("gs://", Cloud::Gcs),
        ("as://", Cloud::Azure),
    ]
    .into_iter()
    .find_map(|(scheme, cloud)| location.strip_prefix(scheme).map(|rest| (cloud, rest)))?;
    let mut endpoint = None;
    let (account, rest) = match cloud {
        Cloud::S3 => {
            let (rest, endpoint_found) = s3_endpoint(rest);
            endpoint = endpoint_found;
            (String::new(), rest)
        }
        Cloud::Azure => match rest.split_once('/') {
            Some((account, rest)) if !account.is_empty() => (account.to_string(), rest),
            _ => {
                return Some(Err(StoreError::Invalid(format!(
                    "repository URL '{location}' must name an account and a container \
                     (as://<account>/<container>/<path>)"
                ))))
            }
        },
        Cloud::Gcs => (String::new(), rest),
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let prefix = prefix.trim_matches('/');
    if bucket.is_empty() {
        let what = if cloud == Cloud::Azure {
            "container"
        } else {
            "bucket"
        };
        return Some(Err(StoreError::Invalid(format!(
            "repository URL '{location}' names no {what}"
        ))));
    }
    if !prefix.is_empty() && !plain_relative(prefix) {
        return Some(Err(StoreError::Invalid(format!(
            "repository URL '{location}': the prefix must be a plain path (no '..', no empty segment)"
        ))));
    }
    Some(Ok(RemoteUrl {
        cloud,
        endpoint,
        account,
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
    }))
}

/// Triton's `[http://|https://]host:port/` before an S3 bucket: the endpoint it names (plain HTTP
/// unless `https://` is written) and the rest of the URL; `rest` itself when it has none.
fn s3_endpoint(rest: &str) -> (&str, Option<String>) {
    let (scheme, after) = if let Some(after) = rest.strip_prefix("https://") {
        ("https", after)
    } else {
        ("http", rest.strip_prefix("http://").unwrap_or(rest))
    };
    let Some((authority, tail)) = after.split_once('/') else {
        return (rest, None);
    };
    let is_host_port = authority.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            && !port.is_empty()
            && port.chars().all(|c| c.is_ascii_digit())
    });
    if is_host_port {
        (tail, Some(format!("{scheme}://{authority}")))
    } else {
        (rest, None)
    }
}

/// A load must fail in seconds, not after object_store's default three minutes of retries.
fn retry() -> RetryConfig {
    RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(30),
        ..RetryConfig::default()
    }
}

/// Client settings kiln gives unless the environment set them: the request timeout covers a whole
/// object's download (object_store's 30 s would fail large models); a dead endpoint still fails
/// within the connect timeout. Set key by key: `with_client_options` would replace what the
/// environment configured.
const CLIENT_DEFAULTS: [(ClientConfigKey, &str); 2] = [
    (ClientConfigKey::ConnectTimeout, "5s"),
    (ClientConfigKey::Timeout, "600s"),
];

/// Sets [`CLIENT_DEFAULTS`] on a builder of any cloud (their key types differ) where the
/// environment left them unset.
macro_rules! with_client_defaults {
    ($builder:expr, $key:path) => {{
        let mut builder = $builder;
        for (key, value) in CLIENT_DEFAULTS {
            let key = $key(key);
            if builder.get_config_value(&key).is_none() {
                builder = builder.with_config(key, value);
            }
        }
        builder
    }};
}

/// The client for `url`, configured from the environment and Triton's credential file.
///
/// # Errors
/// [`StoreError::Invalid`]: the configuration is invalid (object_store's message, or a credential
/// file or entry kiln cannot use). Nothing is reached yet, so nothing is unavailable.
pub fn connect(url: &RemoteUrl, location: &str) -> Result<Arc<dyn ObjectStore>, StoreError> {
    // reqwest is built without a default crypto provider (so that no C toolchain beyond gcc is
    // needed): ring serves TLS. Installing twice is harmless; the first one stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let entry = credentials::for_location(url.cloud, location).map_err(StoreError::Invalid)?;
    let failed = |e: object_store::Error| {
        StoreError::Invalid(format!(
            "cannot configure {} repository {location}: {e}",
            url.cloud.name()
        ))
    };
    Ok(match url.cloud {
        Cloud::S3 => {
            let builder =
                with_client_defaults!(s3(url, location, entry)?, AmazonS3ConfigKey::Client);
            Arc::new(builder.with_retry(retry()).build().map_err(failed)?)
        }
        Cloud::Gcs => {
            let builder = with_client_defaults!(gcs(url, entry), GoogleConfigKey::Client);
            Arc::new(builder.with_retry(retry()).build().map_err(failed)?)
        }
        Cloud::Azure => {
            let builder =
                with_client_defaults!(azure(url, location, entry)?, AzureConfigKey::Client);
            Arc::new(builder.with_retry(retry()).build().map_err(failed)?)
        }
    })
}

fn s3(
    url: &RemoteUrl,
    location: &str,
    entry: Option<Credential>,
) -> Result<AmazonS3Builder, StoreError> {
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
    if let Some(endpoint) = &url.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(Credential::S3(entry)) = entry {
        if !entry.profile.is_empty() && entry.key_id.is_empty() {
            return Err(StoreError::Invalid(format!(
                "the credential of {location} names the AWS profile '{}': kiln reads no AWS \
                 profiles; give key_id and secret_key",
                entry.profile
            )));
        }
        let set = |value: String| (!value.is_empty()).then_some(value);
        if let Some(key) = set(entry.key_id) {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = set(entry.secret_key) {
            builder = builder.with_secret_access_key(secret);
        }
        if let Some(region) = set(entry.region) {
            builder = builder.with_region(region);
        }
        if let Some(token) = set(entry.session_token) {
            builder = builder.with_token(token);
        }
    }
    let endpoint = url.endpoint.clone().or_else(|| {
        ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
            .iter()
            .find_map(|key| std::env::var(key).ok().filter(|v| !v.is_empty()))
    });
    if endpoint.is_some_and(|e| e.starts_with("http://")) {
        builder = builder.with_allow_http(true);
    }
    Ok(builder)
}

fn gcs(url: &RemoteUrl, entry: Option<Credential>) -> GoogleCloudStorageBuilder {
    let builder = GoogleCloudStorageBuilder::from_env().with_bucket_name(&url.bucket);
    let Some(Credential::Gcs(path)) = entry else {
        return builder;
    };
    // Triton's value is a GOOGLE_APPLICATION_CREDENTIALS file: a service account's key (read as
    // one, so that its endpoint settings apply) or a gcloud user's.
    let user = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .is_some_and(|json| json["type"] == "authorized_user");
    if user {
        builder.with_application_credentials(path)
    } else {
        builder.with_service_account_path(path)
    }
}

fn azure(
    url: &RemoteUrl,
    location: &str,
    entry: Option<Credential>,
) -> Result<MicrosoftAzureBuilder, StoreError> {
    let mut builder = MicrosoftAzureBuilder::from_env()
        .with_account(&url.account)
        .with_container_name(&url.bucket);
    if let Some(Credential::Azure(entry)) = entry {
        if !entry.account_str.is_empty() && entry.account_str != url.account {
            return Err(StoreError::Invalid(format!(
                "the credential of {location} is for account '{}', not '{}'",
                entry.account_str, url.account
            )));
        }
        if !entry.account_key.is_empty() {
            builder = builder.with_access_key(entry.account_key);
        }
    }
    // Triton's name for the shared key.
    if builder
        .get_config_value(&AzureConfigKey::AccessKey)
        .is_none()
    {
        if let Some(key) = std::env::var("AZURE_STORAGE_KEY")
            .ok()
            .filter(|k| !k.is_empty())
        {
            builder = builder.with_access_key(key);
        }
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(cloud: Cloud, account: &str, bucket: &str, prefix: &str) -> RemoteUrl {
        RemoteUrl {
            cloud,
            endpoint: None,
            account: account.into(),
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn urls_of_each_cloud() {
        assert_eq!(parse_url("/models"), None);
        assert_eq!(parse_url("http://x/y"), None);
        assert_eq!(
            parse_url("s3://bucket/models/"),
            Some(Ok(url(Cloud::S3, "", "bucket", "models")))
        );
        assert_eq!(
            parse_url("s3://bucket"),
            Some(Ok(url(Cloud::S3, "", "bucket", "")))
        );
        assert_eq!(
            parse_url("s3://b/a/b"),
            Some(Ok(url(Cloud::S3, "", "b", "a/b")))
        );
        assert_eq!(
            parse_url("gs://b/a/b/"),
            Some(Ok(url(Cloud::Gcs, "", "b", "a/b")))
        );
        assert_eq!(
            parse_url("as://acct/container/models"),
            Some(Ok(url(Cloud::Azure, "acct", "container", "models")))
        );
        assert_eq!(
            parse_url("as://acct/container"),
            Some(Ok(url(Cloud::Azure, "acct", "container", "")))
        );
        let no_bucket = "names no bucket";
        let plain = ": the prefix must be a plain path (no '..', no empty segment)";
        let account = "must name an account and a container (as://<account>/<container>/<path>)";
        for (bad, why) in [
            ("s3://", no_bucket),
            ("s3:///models", no_bucket),
            ("s3://b/../x", plain),
            ("s3://b/a//c", plain),
            ("gs://", no_bucket),
            ("gs://b/a/../c", plain),
            ("as://acct", account),
            ("as://acct/", "names no container"),
            ("as:///container/x", account),
            ("as://acct/c/../x", plain),
        ] {
            let space = if why.starts_with(':') { "" } else { " " };
            assert_eq!(
                parse_url(bad).unwrap().unwrap_err(),
                StoreError::Invalid(format!("repository URL '{bad}'{space}{why}"))
            );
        }
        assert!(parse_url("as://acct")
            .unwrap()
            .unwrap_err()
            .to_string()
            .contains("as://<account>/<container>/<path>"));
    }

    #[test]
    fn s3_urls_may_name_their_server_as_triton_reads_them() {
        let with = |endpoint: &str, prefix: &str| RemoteUrl {
            endpoint: Some(endpoint.into()),
            ..url(Cloud::S3, "", "bucket", prefix)
        };
        assert_eq!(
            parse_url("s3://127.0.0.1:9000/bucket/models"),
            Some(Ok(with("http://127.0.0.1:9000", "models")))
        );
        assert_eq!(
            parse_url("s3://http://minio.local:9000/bucket"),
            Some(Ok(with("http://minio.local:9000", "")))
        );
        assert_eq!(
            parse_url("s3://https://s3.example.com:443/bucket/a/b"),
            Some(Ok(with("https://s3.example.com:443", "a/b")))
        );
        // Without a port the first segment is the bucket, as in Triton.
        assert_eq!(
            parse_url("s3://bucket.example.com/models"),
            Some(Ok(url(Cloud::S3, "", "bucket.example.com", "models")))
        );
        assert_eq!(
            parse_url("s3://127.0.0.1:9000/").unwrap(),
            Err(StoreError::Invalid(
                "repository URL 's3://127.0.0.1:9000/' names no bucket".into()
            ))
        );
        assert!(parse_url("s3://host:port/bucket")
            .unwrap()
            .unwrap()
            .endpoint
            .is_none());
    }

    #[test]
    fn cache_names_keep_accounts_apart() {
        assert_eq!(url(Cloud::S3, "", "b", "p").cache_name(), "b");
        assert_eq!(url(Cloud::Azure, "acct", "c", "p").cache_name(), "acct-c");
    }
}
