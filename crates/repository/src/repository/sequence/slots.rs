//! Which instance a new sequence of a stateful Python model runs on, as Triton's sequence
//! batcher decides it. Each instance has a number of sequence slots (the model's
//! `max_batch_size`, at least 1, or `oldest.max_candidate_sequences`); the free ones wait in a
//! `std::priority_queue` ordered by slot index alone, so among equal indexes the instance that
//! comes out follows libstdc++'s binary heap: its sift-up on `push` and its hole-down on `pop`.
//! This module replays that heap, so a sequence lands on the instance it would in Triton
//! (checked against Triton 2.51 on a two-instance model, sequences started and ended in turn).

/// A free sequence slot: (instance, slot index within the instance).
pub type Seat = (usize, usize);

/// The free sequence slots of a model's instances.
#[derive(Debug)]
pub struct Seats {
    heap: Vec<Seat>,
}

/// The priority queue's order: `a` comes out after `b` when its slot index is larger.
fn after(a: Seat, b: Seat) -> bool {
    a.1 > b.1
}

impl Seats {
    /// Every slot of `instances` instances, `per_instance` each, free, pushed instance by
    /// instance as Triton creates its batchers.
    pub fn new(instances: usize, per_instance: usize) -> Seats {
        let mut seats = Seats {
            heap: Vec::with_capacity(instances * per_instance),
        };
        for instance in 0..instances {
            for slot in 0..per_instance {
                seats.give_back((instance, slot));
            }
        }
        seats
    }

    /// The slot a new sequence takes; `None` when all are taken.
    pub fn take(&mut self) -> Option<Seat> {
        let top = *self.heap.first()?;
        let last = self.heap.pop().expect("not empty");
        if !self.heap.is_empty() {
            self.adjust(0, last);
        }
        Some(top)
    }

    /// A slot whose sequence ended.
    pub fn give_back(&mut self, seat: Seat) {
        self.heap.push(seat);
        let hole = self.heap.len() - 1;
        self.sift_up(hole, 0, seat);
    }

    /// libstdc++'s `__push_heap`: `value` rises from `hole` towards `top`.
    fn sift_up(&mut self, mut hole: usize, top: usize, value: Seat) {
        while hole > top {
            let parent = (hole - 1) / 2;
            if !after(self.heap[parent], value) {
                break;
            }
            self.heap[hole] = self.heap[parent];
            hole = parent;
        }
        self.heap[hole] = value;
    }

    /// libstdc++'s `__adjust_heap`: the hole at `hole` goes down to a leaf, always to the child
    /// that comes out first (the right one on a tie), then `value` rises from there.
    fn adjust(&mut self, mut hole: usize, value: Seat) {
        let len = self.heap.len();
        let top = hole;
        let mut child = hole;
        while child < (len - 1) / 2 {
            child = 2 * (child + 1);
            if after(self.heap[child], self.heap[child - 1]) {
                child -= 1;
            }
            self.heap[hole] = self.heap[child];
            hole = child;
        }
        if len % 2 == 0 && child == (len - 2) / 2 {
            child = 2 * (child + 1);
            self.heap[hole] = self.heap[child - 1];
            hole = child - 1;
        }
        self.sift_up(hole, top, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_follow_tritons_heap() {
        // Triton 2.51, a model of two instances and max_batch_size 4, sequences one at a time:
        // the first on instance 0, each later one on instance 1 (bench/triton_parity.sh).
        let mut seats = Seats::new(2, 4);
        let first = seats.take().unwrap();
        assert_eq!(first, (0, 0));
        seats.give_back(first);
        let second = seats.take().unwrap();
        assert_eq!(second, (1, 0));
        seats.give_back(second);
        let third = seats.take().unwrap();
        assert_eq!(third, (0, 0));
        seats.give_back(third);
        assert_eq!(seats.take(), Some((1, 0)));
    }

    #[test]
    fn slots_come_out_lowest_index_first_and_run_out() {
        let mut seats = Seats::new(3, 2);
        let mut taken: Vec<Seat> = std::iter::from_fn(|| seats.take()).collect();
        assert_eq!(taken.len(), 6);
        let indexes: Vec<usize> = taken.iter().map(|seat| seat.1).collect();
        assert_eq!(indexes, [0, 0, 0, 1, 1, 1]);
        taken.sort_unstable();
        assert_eq!(taken, [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]);
        assert_eq!(seats.take(), None);
        seats.give_back((2, 1));
        assert_eq!(seats.take(), Some((2, 1)));
        assert!(Seats::new(0, 4).take().is_none());
    }
}
