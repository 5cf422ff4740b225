//! [`SortedMap`]: an ordered map in one exactly-sized vector, for the plan's small maps.
//!
//! A Service port plans one virtual server or a few, each with a handful of real servers. A
//! `BTreeMap` allocates a node with room for eleven entries even for one, so most of a plan
//! would be empty slots; a sorted vector holds exactly its entries. Lookups are binary
//! searches; inserting into a large map moves the entries after the new one (plans are built
//! in one go, from an iterator, which sorts once).

use std::fmt;

/// An ordered map kept as a sorted vector of `(key, value)` without spare capacity. Its
/// methods follow `BTreeMap`'s.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SortedMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for SortedMap<K, V> {
    fn default() -> Self {
        SortedMap {
            entries: Vec::new(),
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for SortedMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|(k, v)| (k, v)))
            .finish()
    }
}

impl<K, V> SortedMap<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        SortedMap::default()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in key order.
    pub fn iter(&self) -> Iter<'_, K, V> {
        Iter {
            inner: self.entries.iter(),
        }
    }

    /// The entries in key order, values mutable.
    pub fn iter_mut(&mut self) -> IterMut<'_, K, V> {
        IterMut {
            inner: self.entries.iter_mut(),
        }
    }

    /// The keys in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator + Clone {
        self.entries.iter().map(|(k, _)| k)
    }

    /// The values in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator + Clone {
        self.entries.iter().map(|(_, v)| v)
    }

    /// The values in key order, mutable.
    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut V> + ExactSizeIterator {
        self.entries.iter_mut().map(|(_, v)| v)
    }

    /// The entry with the smallest key.
    pub fn first_key_value(&self) -> Option<(&K, &V)> {
        self.entries.first().map(|(k, v)| (k, v))
    }

    /// Removes and returns the entry with the smallest key.
    pub fn pop_first(&mut self) -> Option<(K, V)> {
        if self.entries.is_empty() {
            return None;
        }
        let first = self.entries.remove(0);
        self.entries.shrink_to_fit();
        Some(first)
    }

    /// Keeps only the entries for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.entries.retain_mut(|(k, v)| keep(k, v));
        self.entries.shrink_to_fit();
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.entries = Vec::new();
    }
}

impl<K: Ord, V> SortedMap<K, V> {
    fn find(&self, key: &K) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.cmp(key))
    }

    /// The value of `key`.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).ok().map(|at| &self.entries[at].1)
    }

    /// The value of `key`, mutable.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.find(key).ok().map(|at| &mut self.entries[at].1)
    }

    /// Whether the map has `key`.
    pub fn contains_key(&self, key: &K) -> bool {
        self.find(key).is_ok()
    }

    /// Sets the value of `key`; returns the value it had.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            Err(at) => {
                self.entries.reserve_exact(1);
                self.entries.insert(at, (key, value));
                None
            }
        }
    }

    /// Removes `key`; returns the value it had.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let at = self.find(key).ok()?;
        let (_, value) = self.entries.remove(at);
        self.entries.shrink_to_fit();
        Some(value)
    }
}

impl<K: Ord, V> std::ops::Index<&K> for SortedMap<K, V> {
    type Output = V;

    /// The value of `key`.
    ///
    /// # Panics
    /// When the map has no `key` (as `BTreeMap`'s indexing).
    fn index(&self, key: &K) -> &V {
        match self.get(key) {
            Some(value) => value,
            None => panic!("SortedMap: no entry for the key"),
        }
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SortedMap<K, V> {
    /// Collects entries; of equal keys the last one wins, as with `BTreeMap`.
    fn from_iter<T: IntoIterator<Item = (K, V)>>(iter: T) -> Self {
        let mut entries: Vec<(K, V)> = iter.into_iter().collect();
        // Stable: equal keys keep their order, the last one is kept below.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(K, V)> = Vec::with_capacity(entries.len());
        for entry in entries {
            match out.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => out.push(entry),
            }
        }
        out.shrink_to_fit();
        SortedMap { entries: out }
    }
}

impl<K: Ord, V> Extend<(K, V)> for SortedMap<K, V> {
    fn extend<T: IntoIterator<Item = (K, V)>>(&mut self, iter: T) {
        for (key, value) in iter {
            self.insert(key, value);
        }
    }
}

impl<K: Ord, V, const N: usize> From<[(K, V); N]> for SortedMap<K, V> {
    fn from(entries: [(K, V); N]) -> Self {
        entries.into_iter().collect()
    }
}

/// Iterator over a [`SortedMap`]'s entries, in key order.
#[derive(Debug, Clone)]
pub struct Iter<'a, K, V> {
    inner: std::slice::Iter<'a, (K, V)>,
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|(k, v)| (k, v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<K, V> DoubleEndedIterator for Iter<'_, K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner.next_back().map(|(k, v)| (k, v))
    }
}

impl<K, V> ExactSizeIterator for Iter<'_, K, V> {}

/// Iterator over a [`SortedMap`]'s entries with mutable values, in key order.
#[derive(Debug)]
pub struct IterMut<'a, K, V> {
    inner: std::slice::IterMut<'a, (K, V)>,
}

impl<'a, K, V> Iterator for IterMut<'a, K, V> {
    type Item = (&'a K, &'a mut V);

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|(k, v)| (&*k, v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<K, V> ExactSizeIterator for IterMut<'_, K, V> {}

impl<'a, K, V> IntoIterator for &'a SortedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a, K, V> IntoIterator for &'a mut SortedMap<K, V> {
    type Item = (&'a K, &'a mut V);
    type IntoIter = IterMut<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl<K, V> IntoIterator for SortedMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_an_ordered_map_without_spare_room() {
        let mut map: SortedMap<u32, &str> = [(3, "c"), (1, "a"), (3, "C")].into_iter().collect();
        assert_eq!(map.iter().collect::<Vec<_>>(), [(&1, &"a"), (&3, &"C")]);
        assert_eq!(map.entries.capacity(), 2);
        assert_eq!(map.insert(2, "b"), None);
        assert_eq!(map.insert(2, "B"), Some("b"));
        assert_eq!(map.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(map.entries.capacity(), 3);
        assert_eq!(map.get(&2), Some(&"B"));
        assert!(map.contains_key(&1) && !map.contains_key(&4));
        assert_eq!(map.remove(&1), Some("a"));
        assert_eq!(map.remove(&1), None);
        assert_eq!(map.entries.capacity(), 2);
        assert_eq!(map.first_key_value(), Some((&2, &"B")));
        map.retain(|k, _| *k != 2);
        assert_eq!(map.into_iter().collect::<Vec<_>>(), [(3, "C")]);
    }
}
