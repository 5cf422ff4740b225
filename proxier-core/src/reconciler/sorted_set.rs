//! A small ordered set kept in one exactly-sized vector: the reconciler's per-virtual-server
//! and per-address sets hold one element almost always, where a `BTreeSet` allocates a node
//! for eleven and a `HashSet` a table for four.

/// An ordered set of few elements in a vector of exactly their number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SortedVecSet<T> {
    elements: Vec<T>,
}

impl<T> Default for SortedVecSet<T> {
    fn default() -> Self {
        SortedVecSet {
            elements: Vec::new(),
        }
    }
}

impl<T: Ord> SortedVecSet<T> {
    /// Adds `element`; returns whether it was new.
    pub(crate) fn insert(&mut self, element: T) -> bool {
        match self.elements.binary_search(&element) {
            Ok(_) => false,
            Err(at) => {
                self.elements.reserve_exact(1);
                self.elements.insert(at, element);
                true
            }
        }
    }

    /// Removes `element`; returns whether it was there.
    pub(crate) fn remove(&mut self, element: &T) -> bool {
        match self.elements.binary_search(element) {
            Ok(at) => {
                self.elements.remove(at);
                self.elements.shrink_to_fit();
                true
            }
            Err(_) => false,
        }
    }

    /// The smallest element.
    pub(crate) fn first(&self) -> Option<&T> {
        self.elements.first()
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }

    /// The elements, smallest first.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.elements.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_elements_ordered_and_unique_in_exactly_sized_storage() {
        let mut set = SortedVecSet::default();
        assert!(set.insert(3));
        assert!(set.insert(1));
        assert!(!set.insert(3));
        assert!(set.insert(2));
        assert_eq!(set.iter().copied().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(set.first(), Some(&1));
        assert_eq!(set.elements.capacity(), 3);
        assert!(set.remove(&1));
        assert!(!set.remove(&1));
        assert_eq!(set.first(), Some(&2));
        assert_eq!(set.elements.capacity(), 2);
        assert!(set.remove(&2) && set.remove(&3));
        assert!(set.is_empty());
    }
}
