//! The continuous-batching state, as pure data: which sequences are in the running batch (one
//! row each, in the order of the KV cache's rows), how many positions each has cached, which
//! requests wait to join, and the model inputs this implies. Rows are left-padded to the longest:
//! row `r` holds its `len` positions at the end of a cache of `cache_len` positions.
//!
//! The loop ([`super::runner`]) asks this state what to run and how to rebuild the cache when
//! sequences join or leave; every decision is here, unit-tested without a model.

use std::collections::VecDeque;

/// A forward pass's inputs and a prefill's, laid out as the decoder takes them.
pub use crate::backend::decoder::{prefill_inputs, Inputs};

/// A sequence in the running batch.
#[derive(Debug)]
pub struct Row<T> {
    pub seq: T,
    /// Positions cached for this sequence (its prompt and every generated token but the last).
    pub len: usize,
}

/// Where a row of a rebuilt cache comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Row `row` of the running batch's cache.
    Batch(usize),
    /// Row `row` of the cache a prefill just produced.
    Prefill(usize),
}

/// One row of a rebuilt cache: its origin and how many positions to keep (from the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gather {
    pub origin: Origin,
    pub len: usize,
}

/// The running batch and the queue of requests waiting to join it.
#[derive(Debug)]
pub struct BatchState<T> {
    /// Most sequences in the batch at once; 1 turns continuous batching off.
    capacity: usize,
    pending: VecDeque<T>,
    rows: Vec<Row<T>>,
    /// Positions in the batch cache (the longest row's `len`).
    cache_len: usize,
}

impl<T> BatchState<T> {
    pub fn new(capacity: usize) -> BatchState<T> {
        BatchState {
            capacity: capacity.max(1),
            pending: VecDeque::new(),
            rows: Vec::new(),
            cache_len: 0,
        }
    }

    pub fn enqueue(&mut self, seq: T) {
        self.pending.push_back(seq);
    }

    /// Requests waiting to join.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    pub fn rows(&self) -> &[Row<T>] {
        &self.rows
    }

    pub fn rows_mut(&mut self) -> &mut [Row<T>] {
        &mut self.rows
    }

    /// Nothing runs and nothing waits.
    pub fn is_idle(&self) -> bool {
        self.rows.is_empty() && self.pending.is_empty()
    }

    /// Takes the waiting requests that fit in the batch now, oldest first, as long as their
    /// prompts (`tokens` gives each one's length) add up to at most `budget` tokens; the oldest
    /// is taken whatever its length.
    pub fn take_joining(&mut self, budget: usize, tokens: impl Fn(&T) -> usize) -> Vec<T> {
        let free = self.capacity.saturating_sub(self.rows.len());
        let mut count = 0;
        let mut total = 0usize;
        for seq in self.pending.iter().take(free) {
            total = total.saturating_add(tokens(seq));
            if count > 0 && total > budget {
                break;
            }
            count += 1;
        }
        self.pending.drain(..count).collect()
    }

    /// Drops waiting requests for which `keep` is false (e.g. their client went away).
    pub fn retain_pending(&mut self, keep: impl FnMut(&T) -> bool) {
        self.pending.retain(keep);
    }

    /// Removes the rows for which `keep` is false and returns them, with the plan that rebuilds
    /// the cache from the rows that stay (`None` when nothing left). The padding no longer
    /// needed goes with them.
    pub fn leave(&mut self, mut keep: impl FnMut(&T) -> bool) -> (Vec<T>, Option<Vec<Gather>>) {
        if self.rows.iter().all(|r| keep(&r.seq)) {
            return (Vec::new(), None);
        }
        let mut plan = Vec::new();
        let mut gone = Vec::new();
        let mut stay = Vec::new();
        for (index, row) in std::mem::take(&mut self.rows).into_iter().enumerate() {
            if keep(&row.seq) {
                plan.push(Gather {
                    origin: Origin::Batch(index),
                    len: row.len,
                });
                stay.push(row);
            } else {
                gone.push(row.seq);
            }
        }
        self.rows = stay;
        self.cache_len = self.rows.iter().map(|r| r.len).max().unwrap_or(0);
        (gone, Some(plan))
    }

    /// Adds prefilled sequences (each with its prompt length, in prefill-row order) after the
    /// running rows and returns the plan that builds the joint cache.
    pub fn join(&mut self, joining: Vec<(T, usize)>) -> Vec<Gather> {
        let mut plan: Vec<Gather> = self
            .rows
            .iter()
            .enumerate()
            .map(|(index, row)| Gather {
                origin: Origin::Batch(index),
                len: row.len,
            })
            .collect();
        for (index, (seq, len)) in joining.into_iter().enumerate() {
            plan.push(Gather {
                origin: Origin::Prefill(index),
                len,
            });
            self.rows.push(Row { seq, len });
        }
        self.cache_len = self.rows.iter().map(|r| r.len).max().unwrap_or(0);
        plan
    }

    /// Positions in the batch cache.
    pub fn cache_len(&self) -> usize {
        self.cache_len
    }

    /// Inputs of a decode step: one new token per row (`last` gives each row's), the mask
    /// hiding each row's left padding, and each row's own position.
    pub fn decode_inputs(&self, last: impl Fn(&T) -> u32) -> Inputs {
        let width = self.cache_len + 1;
        let mut attention_mask = Vec::with_capacity(self.rows.len() * width);
        for row in &self.rows {
            let padding = self.cache_len - row.len;
            attention_mask.extend(std::iter::repeat_n(0, padding));
            attention_mask.extend(std::iter::repeat_n(1, width - padding));
        }
        Inputs {
            input_ids: self.rows.iter().map(|r| i64::from(last(&r.seq))).collect(),
            attention_mask,
            position_ids: self.rows.iter().map(|r| r.len as i64).collect(),
            seq: 1,
        }
    }

    /// Records a decode step: every row cached one more position.
    pub fn advance(&mut self) {
        for row in &mut self.rows {
            row.len += 1;
        }
        self.cache_len += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_left_pads_to_the_longest_prompt() {
        let inputs = prefill_inputs(&[&[5, 6, 7], &[9]]);
        assert_eq!(inputs.seq, 3);
        assert_eq!(inputs.input_ids, vec![5, 6, 7, 0, 0, 9]);
        assert_eq!(inputs.attention_mask, vec![1, 1, 1, 0, 0, 1]);
        assert_eq!(inputs.position_ids, vec![0, 1, 2, 0, 0, 0]);
    }

    #[test]
    fn joining_respects_the_capacity_and_arrival_order() {
        let mut state = BatchState::new(2);
        for id in ["a", "b", "c"] {
            state.enqueue(id);
        }
        assert_eq!(state.take_joining(usize::MAX, |_| 1), vec!["a", "b"]);
        assert_eq!(state.pending(), 1);
        state.join(vec![("a", 3), ("b", 1)]);
        assert!(
            state.take_joining(usize::MAX, |_| 1).is_empty(),
            "the batch is full"
        );
        let (gone, _) = state.leave(|s| *s != "a");
        assert_eq!(gone, vec!["a"]);
        assert_eq!(state.take_joining(usize::MAX, |_| 1), vec!["c"]);
        assert!(!state.is_idle());
    }

    #[test]
    fn a_prefill_takes_prompts_up_to_its_token_budget() {
        let mut state = BatchState::new(8);
        for len in [5usize, 4, 3, 20, 1] {
            state.enqueue(len);
        }
        let len = |s: &usize| *s;
        assert_eq!(state.take_joining(10, len), vec![5, 4], "5 + 4 + 3 > 10");
        assert_eq!(state.take_joining(10, len), vec![3]);
        assert_eq!(
            state.take_joining(10, len),
            vec![20],
            "a long prompt goes alone"
        );
        assert_eq!(state.take_joining(10, len), vec![1]);
        assert!(state.take_joining(10, len).is_empty());
    }

    #[test]
    fn capacity_one_runs_one_sequence_at_a_time() {
        let mut state = BatchState::new(1);
        state.enqueue(1);
        state.enqueue(2);
        assert_eq!(state.take_joining(usize::MAX, |_| 1), vec![1]);
        state.join(vec![(1, 4)]);
        assert!(state.take_joining(usize::MAX, |_| 1).is_empty());
        state.leave(|_| false);
        assert_eq!(state.take_joining(usize::MAX, |_| 1), vec![2]);
    }

    #[test]
    fn a_join_appends_prefilled_rows_after_the_running_ones() {
        let mut state = BatchState::new(8);
        state.join(vec![("a", 2)]);
        state.advance();
        state.advance();
        let plan = state.join(vec![("b", 6), ("c", 1)]);
        assert_eq!(
            plan,
            vec![
                Gather {
                    origin: Origin::Batch(0),
                    len: 4
                },
                Gather {
                    origin: Origin::Prefill(0),
                    len: 6
                },
                Gather {
                    origin: Origin::Prefill(1),
                    len: 1
                },
            ]
        );
        assert_eq!(state.cache_len(), 6);
        let lens: Vec<usize> = state.rows().iter().map(|r| r.len).collect();
        assert_eq!(lens, vec![4, 6, 1]);
    }

    #[test]
    fn decode_inputs_mask_each_rows_padding() {
        let mut state = BatchState::new(8);
        state.join(vec![(10u32, 3), (20, 1)]);
        let inputs = state.decode_inputs(|s| *s);
        assert_eq!(inputs.seq, 1);
        assert_eq!(inputs.input_ids, vec![10, 20]);
        assert_eq!(inputs.position_ids, vec![3, 1]);
        assert_eq!(inputs.attention_mask, vec![1, 1, 1, 1, 0, 0, 1, 1]);
        state.advance();
        let inputs = state.decode_inputs(|s| *s);
        assert_eq!(inputs.position_ids, vec![4, 2]);
        assert_eq!(inputs.attention_mask.len(), 2 * 5);
    }

    #[test]
    fn leaving_frees_rows_and_trims_padding() {
        let mut state = BatchState::new(8);
        state.join(vec![("long", 9), ("short", 2), ("mid", 5)]);
        assert_eq!(state.cache_len(), 9);
        let (gone, plan) = state.leave(|s| *s != "long");
        assert_eq!(gone, vec!["long"]);
        assert_eq!(
            plan.unwrap(),
            vec![
                Gather {
                    origin: Origin::Batch(1),
                    len: 2
                },
                Gather {
                    origin: Origin::Batch(2),
                    len: 5
                },
            ]
        );
        assert_eq!(state.cache_len(), 5, "padding for the longest row is gone");
        let (gone, plan) = state.leave(|_| true);
        assert!(gone.is_empty() && plan.is_none(), "nothing to rebuild");
        let (gone, plan) = state.leave(|_| false);
        assert_eq!(gone.len(), 2);
        assert!(plan.unwrap().is_empty());
        assert_eq!(state.cache_len(), 0);
        assert!(state.is_idle());
    }

    #[test]
    fn cancelled_waiting_requests_never_join() {
        let mut state = BatchState::new(4);
        for id in 0..4 {
            state.enqueue(id);
        }
        state.retain_pending(|id| id % 2 == 0);
        assert_eq!(state.take_joining(usize::MAX, |_| 1), vec![0, 2]);
    }
}
