//! What a Python stub may do beyond its environment's variables: its user and its privileges.
//!
//! A model's code runs in its stub with the rights the stub has. kiln itself is not dumpable
//! (`main` sets `PR_SET_DUMPABLE` to 0): its `/proc/<pid>/environ`, `mem` and `maps` can then be
//! read only with `CAP_SYS_PTRACE`, whatever the reader's user. So that a stub has no such
//! capability even when kiln runs as root, every stub starts with
//!
//! - `PR_SET_NO_NEW_PRIVS`: nothing it runs (a set-uid program, a file with capabilities) gains
//!   privileges;
//! - no capabilities: the bounding set emptied (where kiln may: `CAP_SETPCAP`), the ambient set
//!   cleared, the effective, permitted and inheritable sets set to none, so that a stub of a
//!   root kiln is root without root's powers (no `CAP_SYS_PTRACE`, `CAP_DAC_OVERRIDE`, ...);
//! - with `--python-stub-user USER`, that user's uid and gid and no supplementary groups (kiln
//!   must run as root to switch): the model's files must be readable by it.
//!
//! `--python-stub-drop-privileges=false` leaves stubs kiln's privileges, as Triton's have.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// The user and privileges stubs run with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StubPrivileges {
    /// `--python-stub-user`: the uid and gid to switch to.
    pub user: Option<(u32, u32)>,
    /// No new privileges and no capabilities (on unless `--python-stub-drop-privileges=false`).
    pub drop: bool,
}

impl Default for StubPrivileges {
    fn default() -> StubPrivileges {
        StubPrivileges {
            user: None,
            drop: true,
        }
    }
}

impl StubPrivileges {
    /// The privileges of the flags: `user` a user name or a numeric `uid[:gid]`.
    ///
    /// # Errors
    /// An unknown user, or a user to switch to when kiln is not root.
    pub fn from_flags(user: Option<&str>, drop: bool) -> Result<StubPrivileges, String> {
        let user = user.map(resolve_user).transpose()?;
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        if let Some((to, _)) = user {
            if uid != 0 && to != uid {
                return Err(format!(
                    "--python-stub-user: kiln runs as uid {uid} and can start stubs as another \
                     user only when it runs as root"
                ));
            }
        }
        Ok(StubPrivileges { user, drop })
    }

    /// Makes `command`'s process start with these privileges.
    pub fn apply(&self, command: &mut Command) {
        if !self.drop && self.user.is_none() {
            return;
        }
        let privileges = self.clone();
        // SAFETY: runs in the child between fork and exec and only makes system calls (prctl,
        // setgroups, setgid, setuid, capset), which are async-signal-safe.
        unsafe {
            command.pre_exec(move || privileges.enter());
        }
    }

    /// Gives up what this process should not have (in the child, before exec).
    fn enter(&self) -> std::io::Result<()> {
        let failed = || Err(std::io::Error::last_os_error());
        // SAFETY: plain system calls with constant or local arguments.
        unsafe {
            if self.drop {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return failed();
                }
                // Past the last capability the kernel answers EINVAL; without CAP_SETPCAP,
                // EPERM: then no new privileges alone keeps exec from granting any.
                for capability in 0..64 {
                    libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0);
                }
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL,
                    0,
                    0,
                    0,
                );
            }
            if let Some((uid, gid)) = self.user {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return failed();
                }
            }
            if self.drop && !clear_capabilities() {
                return failed();
            }
        }
        Ok(())
    }
}

/// `capset` with every set empty.
///
/// # Safety
/// A system call on local structs.
unsafe fn clear_capabilities() -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // _LINUX_CAPABILITY_VERSION_3: two `Data`, capabilities 0-31 and 32-63.
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    libc::syscall(libc::SYS_capset, &header, data.as_ptr()) == 0
}

/// The uid and gid of a user name or a numeric `uid[:gid]` (the gid defaults to the user's, or
/// to the uid for a uid with no entry).
fn resolve_user(user: &str) -> Result<(u32, u32), String> {
    let (name, gid) = match user.split_once(':') {
        Some((name, gid)) => {
            let gid = gid
                .parse::<u32>()
                .map_err(|_| format!("--python-stub-user {user:?}: the gid must be a number"))?;
            (name, Some(gid))
        }
        None => (user, None),
    };
    let entry = password_entry(name);
    let uid = match (name.parse::<u32>(), entry) {
        (Ok(uid), _) => uid,
        (Err(_), Some((uid, _))) => uid,
        (Err(_), None) => return Err(format!("--python-stub-user: no user {name:?}")),
    };
    let gid = gid.or(entry.map(|(_, gid)| gid)).unwrap_or(uid);
    Ok((uid, gid))
}

/// The uid and gid `getpwnam_r` gives `name`.
fn password_entry(name: &str) -> Option<(u32, u32)> {
    let name = std::ffi::CString::new(name).ok()?;
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: zeroed passwd is a valid out-parameter; every pointer outlives the call.
    unsafe {
        let mut entry: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let status = libc::getpwnam_r(
            name.as_ptr(),
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        );
        (status == 0 && !found.is_null()).then_some((entry.pw_uid, entry.pw_gid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_resolve_by_name_or_number() {
        assert_eq!(resolve_user("root"), Ok((0, 0)));
        assert_eq!(resolve_user("12345"), Ok((12345, 12345)));
        assert_eq!(resolve_user("12345:7"), Ok((12345, 7)));
        assert!(resolve_user("no-such-user-here").is_err());
        assert!(resolve_user("root:x").is_err());
    }

    #[test]
    fn a_stub_starts_without_capabilities_or_new_privileges() {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg("grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status");
        StubPrivileges::default().apply(&mut command);
        let output = command.output().unwrap();
        assert!(output.status.success(), "{output:?}");
        let status = String::from_utf8(output.stdout).unwrap();
        for line in status.lines() {
            let (name, value) = line.split_once(':').unwrap();
            match name {
                "NoNewPrivs" => assert_eq!(value.trim(), "1"),
                // Emptied only where kiln has CAP_SETPCAP.
                "CapBnd" => {}
                _ => assert_eq!(value.trim().trim_start_matches('0'), "", "{line}"),
            }
        }
    }
}
