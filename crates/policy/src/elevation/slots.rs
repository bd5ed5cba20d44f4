//! Where the policy finds a thread's state by its id: a hash map for real TIDs, a dense
//! table for the simulator's small ids.

use rustc_hash::FxHashMap;

/// Where the policy finds a tracked thread's state: TID → slot in its table.
pub trait SlotIndex: Default {
    fn get(&self, tid: u32) -> Option<u32>;
    fn set(&mut self, tid: u32, slot: u32);
    fn unset(&mut self, tid: u32);
}

/// The daemon's index: real TIDs are sparse (up to pid_max, 2²² on large hosts).
impl SlotIndex for FxHashMap<u32, u32> {
    fn get(&self, tid: u32) -> Option<u32> {
        FxHashMap::get(self, &tid).copied()
    }
    fn set(&mut self, tid: u32, slot: u32) {
        self.insert(tid, slot);
    }
    fn unset(&mut self, tid: u32) {
        self.remove(&tid);
    }
}

/// An index for small, dense ids, such as the simulator's task numbers: a table with
/// one entry per id up to the largest seen. One read where the hash map reads its
/// control bytes and then its entry, both cold in a simulation of 10,000 tasks (busy
/// cfs-rbpe: 3 % of the simulator's time). Not for real TIDs: a TID of 4 million
/// would take 16 MB.
#[derive(Clone, Debug, Default)]
pub struct DenseIndex(Vec<u32>);

const NO_SLOT: u32 = u32::MAX;

impl SlotIndex for DenseIndex {
    #[inline]
    fn get(&self, tid: u32) -> Option<u32> {
        self.0.get(tid as usize).copied().filter(|&s| s != NO_SLOT)
    }
    fn set(&mut self, tid: u32, slot: u32) {
        let i = tid as usize;
        if i >= self.0.len() {
            self.0.resize(i + 1, NO_SLOT);
        }
        self.0[i] = slot;
    }
    fn unset(&mut self, tid: u32) {
        if let Some(s) = self.0.get_mut(tid as usize) {
            *s = NO_SLOT;
        }
    }
}
