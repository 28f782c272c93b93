//! Triton's response cache (`--cache-config local,size=N`, a model's `response_cache { enable:
//! true }`): a request whose model, version and inputs (names, datatypes, shapes and data) match
//! an earlier successful one is answered with that one's outputs without running the model.
//!
//! One cache serves every model, bounded in bytes, least recently used first out. Entries are
//! found by a 128-bit keyed hash of the request (two SipHash keys drawn at start-up), so a client
//! cannot craft two requests that share an entry, and a chance collision is beyond reach (Triton
//! uses a 64-bit unkeyed hash). Outputs are shared, not copied, between the cache and the
//! responses it answers. Triton's gauges of the whole cache (`nv_cache_*`) follow every lookup
//! and insertion.

use crate::core::Tensor;
use metrics::{gauge, Gauge};
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// The parsed `--cache-config` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Bytes the cache may hold (outputs plus a fixed cost per entry).
    pub size: usize,
}

impl CacheConfig {
    /// `local,size=<bytes>` (Triton's `local` cache; `size` may repeat, the last wins).
    ///
    /// # Errors
    /// A message naming the value that is not understood.
    pub fn from_flags(values: &[String]) -> Result<Option<CacheConfig>, String> {
        let mut size = None;
        for value in values {
            let bad = || format!("--cache-config {value}: expected local,size=<bytes>");
            let (cache, setting) = value.split_once(',').ok_or_else(bad)?;
            if cache != "local" {
                return Err(format!(
                    "--cache-config {value}: only the 'local' cache is supported"
                ));
            }
            match setting.split_once('=') {
                Some(("size", bytes)) => {
                    size = Some(bytes.trim().parse::<usize>().map_err(|_| bad())?);
                }
                _ => return Err(bad()),
            }
        }
        Ok(size
            .filter(|&size| size > 0)
            .map(|size| CacheConfig { size }))
    }
}

/// What an entry costs beyond its tensors' data: the key, the bookkeeping, each tensor's header.
const ENTRY_OVERHEAD: usize = 128;
const TENSOR_OVERHEAD: usize = 64;

/// A request's identity in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(u64, u64);

#[derive(Debug)]
pub struct ResponseCache {
    capacity: usize,
    keys: (RandomState, RandomState),
    inner: Mutex<Inner>,
    gauges: Gauges,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// Entries by last use, oldest first.
    by_use: BTreeMap<u64, Key>,
    clock: u64,
    bytes: usize,
    counts: Counts,
}

/// What the cache has done since it started, for its gauges.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    hits: u64,
    misses: u64,
    evictions: u64,
    lookup_us: u64,
    insertion_us: u64,
}

/// Triton's gauges of the whole cache.
#[derive(Debug)]
struct Gauges {
    util: Gauge,
    entries: Gauge,
    hits: Gauge,
    misses: Gauge,
    lookups: Gauge,
    evictions: Gauge,
    lookup_us: Gauge,
    insertion_us: Gauge,
}

impl Gauges {
    fn new() -> Gauges {
        Gauges {
            util: gauge!("nv_cache_util"),
            entries: gauge!("nv_cache_num_entries"),
            hits: gauge!("nv_cache_num_hits"),
            misses: gauge!("nv_cache_num_misses"),
            lookups: gauge!("nv_cache_num_lookups"),
            evictions: gauge!("nv_cache_num_evictions"),
            lookup_us: gauge!("nv_cache_lookup_duration"),
            insertion_us: gauge!("nv_cache_insertion_duration"),
        }
    }

    fn show(&self, inner: &Inner, capacity: usize) {
        let c = inner.counts;
        self.util.set(inner.bytes as f64 / capacity.max(1) as f64);
        self.entries.set(inner.entries.len() as f64);
        self.hits.set(c.hits as f64);
        self.misses.set(c.misses as f64);
        self.lookups.set((c.hits + c.misses) as f64);
        self.evictions.set(c.evictions as f64);
        self.lookup_us.set(c.lookup_us as f64);
        self.insertion_us.set(c.insertion_us as f64);
    }
}

/// Microseconds since `started`.
fn micros_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
}

#[derive(Debug)]
struct Entry {
    outputs: Arc<[Tensor]>,
    bytes: usize,
    used: u64,
}

impl ResponseCache {
    pub fn new(config: CacheConfig) -> ResponseCache {
        let cache = ResponseCache {
            capacity: config.size,
            keys: (RandomState::new(), RandomState::new()),
            inner: Mutex::new(Inner::default()),
            gauges: Gauges::new(),
        };
        cache.gauges.show(&cache.lock(), cache.capacity);
        cache
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key of a request to `model` version `version` with these inputs (in the model's order
    /// and layout).
    pub fn key(&self, model: &str, version: i64, inputs: &[Tensor]) -> Key {
        let hash = |state: &RandomState| {
            let mut hasher = state.build_hasher();
            model.hash(&mut hasher);
            version.hash(&mut hasher);
            inputs.len().hash(&mut hasher);
            for tensor in inputs {
                tensor.name.hash(&mut hasher);
                tensor.datatype.hash(&mut hasher);
                tensor.shape.hash(&mut hasher);
                tensor.data.hash(&mut hasher);
            }
            hasher.finish()
        };
        Key(hash(&self.keys.0), hash(&self.keys.1))
    }

    /// The outputs cached for `key`, which becomes the most recently used entry.
    pub fn get(&self, key: Key) -> Option<Arc<[Tensor]>> {
        let started = Instant::now();
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        let found = inner.entries.get_mut(&key).map(|entry| {
            let before = std::mem::replace(&mut entry.used, now);
            (before, Arc::clone(&entry.outputs))
        });
        if let Some((before, _)) = found {
            inner.by_use.remove(&before);
            inner.by_use.insert(now, key);
            inner.counts.hits += 1;
        } else {
            inner.counts.misses += 1;
        }
        inner.counts.lookup_us += micros_since(started);
        self.gauges.show(&inner, self.capacity);
        found.map(|(_, outputs)| outputs)
    }

    /// Keeps `outputs` for `key`, evicting the least recently used entries to make room. Outputs
    /// larger than the whole cache are not kept.
    pub fn insert(&self, key: Key, outputs: Arc<[Tensor]>) {
        let bytes = ENTRY_OVERHEAD
            + outputs
                .iter()
                .map(|t| TENSOR_OVERHEAD + t.name.len() + 8 * t.shape.len() + t.data.len())
                .sum::<usize>();
        if bytes > self.capacity {
            return;
        }
        let started = Instant::now();
        let mut inner = self.lock();
        if inner.entries.contains_key(&key) {
            return;
        }
        while inner.bytes + bytes > self.capacity {
            let Some((_, oldest)) = inner.by_use.pop_first() else {
                break;
            };
            if let Some(evicted) = inner.entries.remove(&oldest) {
                inner.bytes -= evicted.bytes;
                inner.counts.evictions += 1;
            }
        }
        inner.clock += 1;
        let used = inner.clock;
        inner.by_use.insert(used, key);
        inner.bytes += bytes;
        inner.entries.insert(
            key,
            Entry {
                outputs,
                bytes,
                used,
            },
        );
        inner.counts.insertion_us += micros_since(started);
        self.gauges.show(&inner, self.capacity);
    }

    /// Entries and bytes held.
    #[cfg(test)]
    fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.entries.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::DataType;
    use bytes::Bytes;

    fn tensor(name: &str, data: &[u8]) -> Tensor {
        Tensor::new(
            name,
            DataType::Uint8,
            vec![1, data.len() as i64],
            Bytes::copy_from_slice(data),
        )
    }

    fn cache(size: usize) -> ResponseCache {
        ResponseCache::new(CacheConfig { size })
    }

    #[test]
    fn keys_cover_model_version_and_every_part_of_every_input() {
        let cache = cache(1 << 20);
        let base = cache.key("m", 1, &[tensor("A", b"ab")]);
        assert_eq!(base, cache.key("m", 1, &[tensor("A", b"ab")]));
        let mut reshaped = tensor("A", b"ab");
        reshaped.shape = vec![2, 1];
        let mut retyped = tensor("A", b"ab");
        retyped.datatype = DataType::Int8;
        for other in [
            cache.key("n", 1, &[tensor("A", b"ab")]),
            cache.key("m", 2, &[tensor("A", b"ab")]),
            cache.key("m", 1, &[tensor("B", b"ab")]),
            cache.key("m", 1, &[tensor("A", b"ac")]),
            cache.key("m", 1, &[reshaped]),
            cache.key("m", 1, &[retyped]),
            cache.key("m", 1, &[tensor("A", b"ab"), tensor("A", b"")]),
        ] {
            assert_ne!(base, other);
        }
        // Another cache draws other keys: hashes cannot be precomputed.
        assert_ne!(
            base,
            super::ResponseCache::new(CacheConfig { size: 1 }).key("m", 1, &[tensor("A", b"ab")])
        );
    }

    #[test]
    fn the_least_recently_used_entries_go_first() {
        let entry = |data: &[u8]| -> Arc<[Tensor]> { Arc::from(vec![tensor("OUT", data)]) };
        let one = ENTRY_OVERHEAD + TENSOR_OVERHEAD + 3 + 16 + 100;
        let cache = cache(3 * one);
        let keys: Vec<Key> = (0..4u8)
            .map(|i| cache.key("m", 1, &[tensor("A", &[i])]))
            .collect();
        for key in &keys[..3] {
            cache.insert(*key, entry(&[7; 100]));
        }
        assert_eq!(cache.usage(), (3, 3 * one));
        // Using the first makes the second the oldest.
        assert_eq!(&cache.get(keys[0]).unwrap()[0].data[..], &[7; 100]);
        cache.insert(keys[3], entry(&[8; 100]));
        assert!(cache.get(keys[1]).is_none());
        for key in [keys[0], keys[2], keys[3]] {
            assert!(cache.get(key).is_some());
        }
        assert_eq!(cache.usage(), (3, 3 * one));
        // Too big for the whole cache: not kept, nothing evicted.
        cache.insert(keys[1], entry(&[9; 1000]));
        assert!(cache.get(keys[1]).is_none());
        assert_eq!(cache.usage().0, 3);
        // What the nv_cache_* gauges show: 4 hits, 2 misses, 1 eviction.
        let counts = cache.lock().counts;
        assert_eq!((counts.hits, counts.misses, counts.evictions), (4, 2, 1));
    }

    #[test]
    fn flags_read_like_tritonservers() {
        let flags = |values: &[&str]| {
            CacheConfig::from_flags(&values.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(flags(&[]), Ok(None));
        assert_eq!(
            flags(&["local,size=1048576"]),
            Ok(Some(CacheConfig { size: 1_048_576 }))
        );
        assert_eq!(flags(&["local,size=0"]), Ok(None));
        assert_eq!(
            flags(&["redis,host=x"]).unwrap_err(),
            "--cache-config redis,host=x: only the 'local' cache is supported"
        );
        for bad in ["local,size=big", "local", "local,color=red"] {
            assert_eq!(
                flags(&[bad]).unwrap_err(),
                format!("--cache-config {bad}: expected local,size=<bytes>")
            );
        }
    }
}
