//! "Did you mean …?": the closest known name to a misspelt one.
//!
//! Owns: an edit distance and the threshold for calling two names close. Used for typos in
//! environment variable names and in choice values.

/// Levenshtein distance over bytes, case-insensitive.
pub fn distance(a: &str, b: &str) -> usize {
    let a = a.to_ascii_uppercase().into_bytes();
    let b = b.to_ascii_uppercase().into_bytes();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The candidate closest to `name`, if it is close enough to be a plausible typo:
/// within a third of the name's length (at least 2 edits), or sharing a long prefix.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.len() / 3).max(2);
    candidates
        .into_iter()
        .map(|c| (distance(name, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("same", "SAME"), 0);
    }

    #[test]
    fn closest_finds_typos_only() {
        let names = ["MXNET_GPU_WORKER_NTHREADS", "MXNET_CPU_WORKER_NTHREADS", "MXNET_HOME"];
        assert_eq!(closest("MXNET_GPU_WORKER_NTHREAD", names), Some("MXNET_GPU_WORKER_NTHREADS"));
        assert_eq!(closest("MXNET_HOMES", names), Some("MXNET_HOME"));
        assert_eq!(closest("MXNET_SOMETHING_ELSE_ENTIRELY", names), None);
    }
}
