//! Triton's rate limiter (`--rate-limit=execution_count`): model instances that list resources in
//! their instance group's `rate_limiter` run only while they hold those resources, across every
//! model of the server, so that models which must not all run at once (memory, cores) take turns.
//!
//! - A resource has a number of copies per device (CPU instances count as device 0, as in Triton)
//!   or, when an instance group marks it `global`, one pool for the whole server. Its copies are
//!   the largest count any loaded instance asks for, unless `--rate-limit-resource
//!   <name>:<count>[:<device>]` sets them; an instance asking for more than that cannot load.
//! - An instance takes all its resources at once, before it runs a batch (the wait counts as
//!   queue time), and gives them back when the batch is done.
//! - When several instances wait, the one with the fewest executions weighted by its priority
//!   (`executions × priority`, priority 0 counting as 1) goes first among those whose resources
//!   are free: an instance of priority 2 gets half the turns of one of priority 1.
//!
//! Instances that list no resources are not limited at all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// One resource pool: a name on one device, or a global name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    pub name: String,
    /// `None`: a global resource.
    pub device: Option<i32>,
}

/// What one instance needs to run.
#[derive(Debug)]
pub struct InstanceNeeds {
    resources: Vec<(ResourceKey, u32)>,
    priority: u64,
    executions: AtomicU64,
}

impl InstanceNeeds {
    pub fn new(resources: Vec<(ResourceKey, u32)>, priority: u32) -> InstanceNeeds {
        InstanceNeeds {
            resources: resources
                .into_iter()
                .filter(|(_, count)| *count > 0)
                .collect(),
            priority: u64::from(priority.max(1)),
            executions: AtomicU64::new(0),
        }
    }

    /// Whether the instance needs anything (otherwise it is not limited).
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    fn weight(&self) -> u64 {
        self.executions
            .load(Ordering::Relaxed)
            .saturating_mul(self.priority)
    }
}

/// What one instance group's `rate_limiter` asks of each of its instances on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceLimit {
    pub resources: Vec<(ResourceKey, u32)>,
    pub priority: u32,
}

/// An instance's place in the rate limiter: what it needs, registered with the limiter.
pub struct Limit {
    limiter: Arc<RateLimiter>,
    needs: Arc<InstanceNeeds>,
}

impl Limit {
    /// Registers what an instance needs (`limit`) with `limiter`.
    ///
    /// # Errors
    /// As [`RateLimiter::register`].
    pub fn new(limiter: &Arc<RateLimiter>, limit: &InstanceLimit) -> Result<Limit, String> {
        let needs = Arc::new(InstanceNeeds::new(limit.resources.clone(), limit.priority));
        limiter.register(&needs)?;
        Ok(Limit {
            limiter: Arc::clone(limiter),
            needs,
        })
    }

    /// An instance's place in `limiter` (`--rate-limit`), when there is one and the
    /// instance's group lists resources (`limit`); `None` otherwise: the instance is not limited.
    ///
    /// # Errors
    /// As [`RateLimiter::register`].
    pub fn for_instance(
        limiter: Option<&Arc<RateLimiter>>,
        limit: Option<&InstanceLimit>,
    ) -> Result<Option<Limit>, String> {
        match (limiter, limit) {
            (Some(limiter), Some(limit)) => Limit::new(limiter, limit).map(Some),
            _ => Ok(None),
        }
    }

    /// Waits until the instance's resources are free and holds them until the permit drops.
    pub fn admit(&self) -> Permit {
        self.limiter.acquire(&self.needs)
    }
}

/// `--rate-limit-resource <name>:<count>[:<device>]`: copies set on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceFlags {
    /// (name, device or `None` for every device and the global pool) → copies.
    copies: Vec<(String, Option<i32>, u32)>,
}

impl ResourceFlags {
    /// Reads the flag's values.
    ///
    /// # Errors
    /// A message naming a value that does not parse.
    pub fn parse(values: &[String]) -> Result<ResourceFlags, String> {
        let mut copies = Vec::new();
        for value in values {
            let bad =
                || format!("--rate-limit-resource {value}: expected <name>:<count>[:<device>]");
            let mut parts = value.split(':');
            let name = parts.next().filter(|n| !n.is_empty()).ok_or_else(bad)?;
            let count: u32 = parts.next().and_then(|c| c.parse().ok()).ok_or_else(bad)?;
            let device = match parts.next() {
                None => None,
                Some(device) => Some(
                    device
                        .parse::<i32>()
                        .ok()
                        .filter(|d| *d >= 0)
                        .ok_or_else(bad)?,
                ),
            };
            if parts.next().is_some() {
                return Err(bad());
            }
            copies.push((name.to_string(), device, count));
        }
        Ok(ResourceFlags { copies })
    }

    /// The copies the command line sets for `key` (a device's own value wins over one for every
    /// device).
    fn copies(&self, key: &ResourceKey) -> Option<u32> {
        let named = self.copies.iter().filter(|(name, _, _)| *name == key.name);
        let exact = named
            .clone()
            .rfind(|(_, device, _)| key.device.is_some() && *device == key.device);
        exact
            .or_else(|| named.clone().rfind(|(_, device, _)| device.is_none()))
            .map(|(_, _, count)| *count)
    }
}

/// The server's rate limiter.
#[derive(Debug)]
pub struct RateLimiter {
    flags: ResourceFlags,
    pool: Mutex<Pool>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct Pool {
    copies: HashMap<ResourceKey, u32>,
    in_use: HashMap<ResourceKey, u32>,
    /// Instances waiting to run, with their arrival number.
    waiting: Vec<(u64, Arc<InstanceNeeds>)>,
    arrivals: u64,
}

impl Pool {
    fn fits(&self, needs: &InstanceNeeds) -> bool {
        needs.resources.iter().all(|(key, count)| {
            let copies = self.copies.get(key).copied().unwrap_or(0);
            let used = self.in_use.get(key).copied().unwrap_or(0);
            used + count <= copies
        })
    }
}

/// Resources held while an instance runs; given back when dropped.
#[derive(Debug)]
pub struct Permit {
    limiter: Arc<RateLimiter>,
    needs: Arc<InstanceNeeds>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut pool = self.limiter.lock();
        for (key, count) in &self.needs.resources {
            if let Some(used) = pool.in_use.get_mut(key) {
                *used = used.saturating_sub(*count);
            }
        }
        drop(pool);
        self.limiter.freed.notify_all();
    }
}

impl RateLimiter {
    pub fn new(flags: ResourceFlags) -> RateLimiter {
        RateLimiter {
            flags,
            pool: Mutex::new(Pool::default()),
            freed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes room for an instance's needs: each resource gets at least as many copies as it asks
    /// for, unless the command line fixed fewer.
    ///
    /// # Errors
    /// A message naming a resource the command line gives too few copies of.
    pub fn register(&self, needs: &InstanceNeeds) -> Result<(), String> {
        let mut pool = self.lock();
        for (key, count) in &needs.resources {
            match self.flags.copies(key) {
                Some(copies) if copies < *count => {
                    return Err(format!(
                        "resource '{}' ({}) is asked for {count} times, but \
                         --rate-limit-resource makes only {copies} available",
                        key.name,
                        key.device
                            .map_or_else(|| "global".to_string(), |d| format!("device {d}"))
                    ));
                }
                Some(copies) => {
                    pool.copies.insert(key.clone(), copies);
                }
                None => {
                    let copies = pool.copies.entry(key.clone()).or_insert(0);
                    *copies = (*copies).max(*count);
                }
            }
        }
        drop(pool);
        self.freed.notify_all();
        Ok(())
    }

    /// Waits until `needs` may run (see the module documentation) and takes its resources.
    pub fn acquire(self: &Arc<Self>, needs: &Arc<InstanceNeeds>) -> Permit {
        let mut pool = self.lock();
        pool.arrivals += 1;
        let arrival = pool.arrivals;
        pool.waiting.push((arrival, Arc::clone(needs)));
        loop {
            // The waiter that goes next: the lowest weight, then the earliest, among those whose
            // resources are free now.
            let next = pool
                .waiting
                .iter()
                .filter(|(_, waiter)| pool.fits(waiter))
                .min_by_key(|(arrival, waiter)| (waiter.weight(), *arrival))
                .map(|(arrival, _)| *arrival);
            if next == Some(arrival) {
                pool.waiting.retain(|(a, _)| *a != arrival);
                for (key, count) in &needs.resources {
                    *pool.in_use.entry(key.clone()).or_insert(0) += count;
                }
                needs.executions.fetch_add(1, Ordering::Relaxed);
                drop(pool);
                // Others may fit in what is left.
                self.freed.notify_all();
                return Permit {
                    limiter: Arc::clone(self),
                    needs: Arc::clone(needs),
                };
            }
            pool = self.freed.wait(pool).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(name: &str, device: Option<i32>) -> ResourceKey {
        ResourceKey {
            name: name.into(),
            device,
        }
    }

    fn needs(resources: &[(&str, Option<i32>, u32)], priority: u32) -> Arc<InstanceNeeds> {
        Arc::new(InstanceNeeds::new(
            resources
                .iter()
                .map(|(name, device, count)| (key(name, *device), *count))
                .collect(),
            priority,
        ))
    }

    /// Until `count` instances wait in the pool. A waiter is seen there only once it has released
    /// the lock in `acquire`, that is after it found it may not run and went to sleep: its arrival
    /// number is then fixed, whatever the threads' timing.
    /// The deadline only bounds a failure (one that should wait ran instead).
    fn wait_for_waiters(limiter: &RateLimiter, count: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while limiter.lock().waiting.len() < count {
            assert!(
                std::time::Instant::now() < deadline,
                "fewer than {count} instances wait: one that should have waited ran"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn copies_default_to_the_largest_need_and_flags_override_them() {
        // Triton's example: A [R1: 4, R2: 4], B [R2: 5, R3: 10, R4: 5], C [R1: 1, R3: 7, R4: 2].
        let limiter = RateLimiter::new(ResourceFlags::default());
        for n in [
            needs(&[("R1", Some(0), 4), ("R2", Some(0), 4)], 1),
            needs(
                &[("R2", Some(0), 5), ("R3", Some(0), 10), ("R4", Some(0), 5)],
                1,
            ),
            needs(
                &[("R1", Some(0), 1), ("R3", Some(0), 7), ("R4", Some(0), 2)],
                1,
            ),
        ] {
            limiter.register(&n).unwrap();
        }
        let pool = limiter.lock();
        for (name, copies) in [("R1", 4), ("R2", 5), ("R3", 10), ("R4", 5)] {
            assert_eq!(pool.copies[&key(name, Some(0))], copies, "{name}");
        }
        drop(pool);
        let flags =
            ResourceFlags::parse(&["R1:10".into(), "R2:5:0".into(), "R2:8:1".into()]).unwrap();
        assert_eq!(flags.copies(&key("R1", Some(1))), Some(10));
        assert_eq!(flags.copies(&key("R2", Some(0))), Some(5));
        assert_eq!(flags.copies(&key("R2", Some(1))), Some(8));
        assert_eq!(flags.copies(&key("R1", None)), Some(10));
        assert_eq!(flags.copies(&key("R3", None)), None);
        let limiter = RateLimiter::new(flags);
        let error = limiter
            .register(&needs(&[("R2", Some(0), 6)], 1))
            .unwrap_err();
        assert!(
            error.contains("'R2' (device 0) is asked for 6 times"),
            "{error}"
        );
    }

    #[test]
    fn malformed_flags_are_refused() {
        for bad in ["R", ":1", "R:x", "R:1:-1", "R:1:0:0", "R:-2"] {
            assert_eq!(
                ResourceFlags::parse(&[bad.into()]).unwrap_err(),
                format!("--rate-limit-resource {bad}: expected <name>:<count>[:<device>]")
            );
        }
    }

    #[test]
    fn a_shared_resource_lets_one_instance_run_at_a_time() {
        let limiter = Arc::new(RateLimiter::new(ResourceFlags::default()));
        let a = needs(&[("R", None, 1)], 1);
        let b = needs(&[("R", None, 1)], 1);
        limiter.register(&a).unwrap();
        limiter.register(&b).unwrap();
        let held = limiter.acquire(&a);
        let (sender, received) = std::sync::mpsc::channel();
        let waiter = {
            let limiter = Arc::clone(&limiter);
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                let _permit = limiter.acquire(&b);
                sender.send(()).unwrap();
            })
        };
        wait_for_waiters(&limiter, 1);
        assert!(received.try_recv().is_err(), "B ran beside A");
        drop(held);
        received
            .recv_timeout(Duration::from_secs(10))
            .expect("B runs once A is done");
        waiter.join().unwrap();
        // Other devices' pools are separate.
        let c = needs(&[("R", Some(0), 1)], 1);
        limiter.register(&c).unwrap();
        let _a = limiter.acquire(&a);
        let _c = limiter.acquire(&c);
    }

    #[test]
    fn waiters_take_turns_by_weighted_executions() {
        let limiter = Arc::new(RateLimiter::new(ResourceFlags::default()));
        let fast = needs(&[("R", Some(0), 1)], 1);
        let slow = needs(&[("R", Some(0), 1)], 2);
        limiter.register(&fast).unwrap();
        limiter.register(&slow).unwrap();
        // Both have run once: weights 1 (fast) and 2 (slow).
        drop(limiter.acquire(&fast));
        drop(limiter.acquire(&slow));
        let held = limiter.acquire(&fast); // weight now 2
        let order = Arc::new(Mutex::new(Vec::new()));
        let spawn = |needs: &Arc<InstanceNeeds>, name: &'static str| {
            let (limiter, needs, order) =
                (Arc::clone(&limiter), Arc::clone(needs), Arc::clone(&order));
            std::thread::spawn(move || {
                let _permit = limiter.acquire(&needs);
                order.lock().unwrap().push(name);
            })
        };
        let slow_waiter = spawn(&slow, "slow");
        wait_for_waiters(&limiter, 1);
        let fast_waiter = spawn(&fast, "fast");
        wait_for_waiters(&limiter, 2);
        // fast: 2 executions × 1 = 2; slow: 1 × 2 = 2; equal weights go by arrival: slow first.
        drop(held);
        slow_waiter.join().unwrap();
        fast_waiter.join().unwrap();
        assert_eq!(*order.lock().unwrap(), ["slow", "fast"]);
        assert_eq!(fast.executions.load(Ordering::Relaxed), 3);
    }
}
