//! The order in which Triton's core visits a request's inputs. Its `InferenceRequest` keeps them
//! in a `std::unordered_map<std::string, Input>`, and validation reports the first problem it
//! meets walking that map, so which input an error names when several are wrong, and the order
//! of "Got input(s) [...]", follow libstdc++'s table: `std::hash<std::string>` and the prime
//! bucket counts it grows through. This module reproduces that walk (checked against g++ 12's
//! `unordered_map` on random names, up to 300 per request, and against Triton 2.51's messages).
//! Only error messages use it; valid requests never pay for it.

/// Beyond this many names the walk is not modelled (its cost grows with the square): request
/// order.
const MODELLED: usize = 300;

/// The bucket counts libstdc++'s prime rehash policy goes through from the first insertion on
/// (a maximum load factor of 1: the table grows when an element would exceed the count).
const BUCKET_COUNTS: [u64; 6] = [13, 29, 59, 127, 257, 541];

/// libstdc++'s `std::_Hash_bytes` (64-bit) with the seed of `std::hash<std::string>`.
fn std_hash(name: &str) -> u64 {
    const MUL: u64 = (0xc6a4_a793 << 32) + 0x5bd1_e995;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let bytes = name.as_bytes();
    let mut hash = 0xc70f_6907 ^ (bytes.len() as u64).wrapping_mul(MUL);
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let data = u64::from_le_bytes(word.try_into().expect("chunks of eight bytes"));
        hash ^= shift_mix(data.wrapping_mul(MUL)).wrapping_mul(MUL);
        hash = hash.wrapping_mul(MUL);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut data = [0u8; 8];
        data[..tail.len()].copy_from_slice(tail);
        hash ^= u64::from_le_bytes(data);
        hash = hash.wrapping_mul(MUL);
    }
    shift_mix(shift_mix(hash).wrapping_mul(MUL))
}

/// Indexes into `names` in the order Triton's core walks them once added one by one (a repeated
/// name is not added again).
pub fn visit_order(names: &[&str]) -> Vec<usize> {
    if names.len() > MODELLED {
        return (0..names.len()).collect();
    }
    let hashes: Vec<u64> = names.iter().map(|name| std_hash(name)).collect();
    let mut counts = BUCKET_COUNTS.iter().copied();
    let mut buckets = counts.next().expect("a first bucket count");
    let mut walk: Vec<usize> = Vec::with_capacity(names.len());
    for (index, name) in names.iter().enumerate() {
        if walk.iter().any(|&seen| names[seen] == *name) {
            continue;
        }
        if walk.len() as u64 + 1 > buckets {
            // A rehash moves the nodes, in their walking order, as insertions do.
            buckets = counts
                .next()
                .expect("MODELLED stays below the last bucket count");
            for node in std::mem::take(&mut walk) {
                insert(&mut walk, node, &hashes, buckets);
            }
        }
        insert(&mut walk, index, &hashes, buckets);
    }
    walk
}

/// Indexes into `inputs` in the order a Python model's `request.inputs()` lists them in
/// Triton: its core copies the request's inputs, walking them as [`visit_order`] does, into a
/// second map, adds to that the inputs the server fills (sequence controls, in `inputs`' order),
/// and the backend lists the second map as it walks it. `arrival` names the request's own
/// inputs in the order it sent them; `inputs` are those and the added ones, in any order.
pub fn listed_order(arrival: &[&str], inputs: &[&str]) -> Vec<usize> {
    let mut names: Vec<&str> = visit_order(arrival)
        .into_iter()
        .map(|index| arrival[index])
        .collect();
    names.extend(inputs.iter().filter(|name| !arrival.contains(name)));
    visit_order(&names)
        .into_iter()
        .filter_map(|index| inputs.iter().position(|name| *name == names[index]))
        .collect()
}

/// libstdc++'s insertion: at the front of the nodes of the same bucket, else at the very front.
fn insert(walk: &mut Vec<usize>, node: usize, hashes: &[u64], buckets: u64) {
    let bucket = hashes[node] % buckets;
    let at = walk
        .iter()
        .position(|&other| hashes[other] % buckets == bucket)
        .unwrap_or(0);
    walk.insert(at, node);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `names` in visiting order.
    fn walked<'a>(names: &[&'a str]) -> Vec<&'a str> {
        visit_order(names).into_iter().map(|i| names[i]).collect()
    }

    #[test]
    fn matches_libstdcxx_unordered_map() {
        // Iteration orders printed by g++ 12 for `unordered_map<string, int>` after emplacing
        // the names in this order.
        assert_eq!(walked(&["INPUT0", "INPUT1"]), ["INPUT1", "INPUT0"]);
        assert_eq!(
            walked(&["INPUT0", "INPUT1", "INPUT2"]),
            ["INPUT2", "INPUT1", "INPUT0"]
        );
        assert_eq!(
            walked(&[
                "text_input",
                "max_tokens",
                "stream",
                "bad_words",
                "stop_words"
            ]),
            [
                "bad_words",
                "stream",
                "max_tokens",
                "stop_words",
                "text_input"
            ]
        );
        assert_eq!(
            walked(&["IN_BOOL", "IN_UINT8", "IN_INT32", "IN_FP32", "IN_BYTES"]),
            ["IN_BYTES", "IN_FP32", "IN_INT32", "IN_UINT8", "IN_BOOL"]
        );
        // Twenty names: the table grows from 13 buckets to 29 on the fourteenth.
        let twenty: Vec<String> = (0..20).map(|i| format!("IN_{i}")).collect();
        let twenty: Vec<&str> = twenty.iter().map(String::as_str).collect();
        let expected = "IN_19 IN_18 IN_17 IN_14 IN_0 IN_16 IN_10 IN_2 IN_15 IN_6 IN_4 IN_3 IN_11 \
                        IN_13 IN_5 IN_1 IN_7 IN_12 IN_8 IN_9";
        assert_eq!(walked(&twenty).join(" "), expected);
    }

    #[test]
    fn a_python_model_lists_inputs_as_triton() {
        // What `request.inputs()` gave in Triton 2.51 (REST requests sending these names in
        // this order to a model with inputs A to M, all optional; and to a stateful one with
        // START, END, READY and CORRID controls added).
        let listed = |arrival: &str, added: &[&str]| {
            let arrival: Vec<&str> = arrival.split(',').collect();
            // As validation leaves them: sorted, then the added ones.
            let mut inputs = arrival.clone();
            inputs.sort_unstable();
            inputs.extend(added);
            listed_order(&arrival, &inputs)
                .into_iter()
                .map(|index| inputs[index])
                .collect::<Vec<_>>()
                .join(",")
        };
        for (arrival, triton) in [
            ("L,F,H,K,B,A,C,D", "L,F,H,B,K,A,C,D"),
            ("G,D,E,B,K,L", "G,D,E,K,B,L"),
            ("I,K,G,M,D,H,B,E,A,J,C,L", "I,D,A,C,K,E,G,M,L,H,B,J"),
            ("I,H,M,D,B,A,L,K,F,E,C", "I,D,A,C,H,B,M,L,K,E,F"),
            ("J,K,G,M", "J,K,G,M"),
            ("A", "A"),
        ] {
            assert_eq!(listed(arrival, &[]), triton, "{arrival}");
        }
        let controls = ["START", "END", "READY", "CORRID"];
        assert_eq!(listed("Z", &controls), "READY,CORRID,END,START,Z");
        assert_eq!(listed("Y,X,Z", &controls), "READY,CORRID,END,START,Y,X,Z");
        assert_eq!(listed("X,Y", &controls), "READY,CORRID,END,START,X,Y");
        assert_eq!(listed_order(&[], &[]), Vec::<usize>::new());
    }

    #[test]
    fn repeated_names_and_long_requests() {
        assert_eq!(visit_order(&["a", "a"]), [0]);
        assert_eq!(visit_order(&[]), Vec::<usize>::new());
        let many: Vec<String> = (0..=MODELLED).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(visit_order(&many), (0..many.len()).collect::<Vec<_>>());
        let most = &many[..MODELLED];
        let mut order = visit_order(most);
        order.sort_unstable();
        assert_eq!(order, (0..MODELLED).collect::<Vec<_>>());
    }
}
