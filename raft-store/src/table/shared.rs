//! [`Shared`]: a part of the lock table behind an `Arc`, so that cloning the table (the
//! snapshot builder's view) shares it, and changing it copies it only while a clone still
//! holds it (`Arc::make_mut`). Encodes as the value itself, so snapshots are unchanged by it.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A `T` shared by the table and its clones until one of them changes it.
#[derive(Default)]
pub(crate) struct Shared<T>(Arc<T>);

impl<T> Shared<T> {
    /// `value`, not yet shared.
    pub(crate) fn new(value: T) -> Self {
        Shared(Arc::new(value))
    }

    /// Whether `a` and `b` are one value, not two equal ones (for the tests of sharing).
    #[cfg(test)]
    pub(crate) fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl<T: Clone> Shared<T> {
    /// The value, to change: copied first if a clone of the table still shares it.
    pub(crate) fn make_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        *self.0 == *other.0
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Shared<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Shared::new)
    }
}
