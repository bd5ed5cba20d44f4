//! Process trees from (pid, parent pid) pairs: the one walk every part of appease uses.

use std::collections::HashMap;

/// Each process's children.
#[derive(Debug, Default)]
pub struct Children(HashMap<u32, Vec<u32>>);

impl Children {
    /// From (pid, parent pid) pairs; a process that is its own parent (pid 0's) is no child.
    pub fn new(pairs: impl IntoIterator<Item = (u32, u32)>) -> Self {
        let mut map: HashMap<u32, Vec<u32>> = HashMap::new();
        for (pid, ppid) in pairs {
            if pid != ppid {
                map.entry(ppid).or_default().push(pid);
            }
        }
        Children(map)
    }

    /// The direct children of `pid`.
    pub fn of(&self, pid: u32) -> &[u32] {
        self.0.get(&pid).map_or(&[], Vec::as_slice)
    }

    /// Every process below `roots`, parents before children (breadth first), roots not
    /// included. Linear in the size of the result.
    pub fn below(&self, roots: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = roots.to_vec();
        let mut i = 0;
        while i < out.len() {
            let kids = self.of(out[i]);
            out.extend_from_slice(kids);
            i += 1;
        }
        out.drain(..roots.len());
        out
    }

    /// `root` and every process below it.
    pub fn subtree(&self, root: u32) -> Vec<u32> {
        let mut out = vec![root];
        out.extend(self.below(&[root]));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subtree_is_the_root_then_its_descendants_parents_first() {
        // 1 -> 2 -> {3, 4}; 4 -> 5; 6 elsewhere; 0 is its own parent.
        let c = Children::new([(1, 0), (2, 1), (3, 2), (4, 2), (5, 4), (6, 0), (0, 0)]);
        assert_eq!(c.subtree(2), vec![2, 3, 4, 5]);
        assert_eq!(c.below(&[2]), vec![3, 4, 5]);
        assert_eq!(c.below(&[3, 6]), Vec::<u32>::new());
        assert_eq!(c.of(0), &[1, 6]);
        assert_eq!(c.subtree(42), vec![42], "an unknown root is a tree of one");
    }
}
