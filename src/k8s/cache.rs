//! A watch-fed cache that keeps, per object, only the slim value the
//! daemon reads (not the object): kube-runtime's reflector stores whole
//! objects, which at 10,000 NetworkAttachmentDefinitions is tens of MiB of
//! `managedFields` and annotations nobody reads.
//!
//! - Entries sit in one vector sorted by (namespace, name): the key (16
//!   bytes and one small allocation) and the value (32 bytes for a NAD)
//!   per object, no hash table slack, found by binary search. Inserting or
//!   removing one object moves the entries after it: at 100,000 NADs a
//!   few MB of memmove per watch event, which NAD changes are rare enough
//!   to afford.
//! - Texts that repeat across objects (the same NAD config copied into
//!   every namespace) are stored once ([`Texts`]).
//! - A (re)list fills a buffer from `Init` to `InitDone`, then replaces
//!   the entries at once: until then readers see the previous contents
//!   (possibly stale, never half a list), and objects deleted while the
//!   watch was away are gone after it. `Apply` and `Delete` change the
//!   entries in place.
//! - A list's pages are decoded and dropped one after another; once the
//!   list is in, the memory they took is given back to the system
//!   ([`crate::memory::release_free_memory`]), else it stays resident.

use std::cmp::Ordering;
use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use kube::runtime::watcher;

/// What the cache keeps of one watched object.
pub trait Slim {
    type Value;

    /// The object's (namespace, name).
    fn key(&self) -> (&str, &str);

    /// What is kept of the object, its texts shared through `texts`.
    fn into_value(self, texts: &mut Texts) -> Self::Value;

    /// Gives `value`'s shared texts back before it is dropped.
    fn release(value: Self::Value, texts: &mut Texts);
}

/// Texts shared by the values of one cache: each distinct text is held
/// once, for as long as a value uses it.
#[derive(Debug, Default)]
pub struct Texts(HashSet<Arc<str>>);

impl Texts {
    /// `text`, shared with the values that hold the same text.
    pub fn share(&mut self, text: &str) -> Arc<str> {
        if let Some(t) = self.0.get(text) {
            return t.clone();
        }
        let t: Arc<str> = Arc::from(text);
        self.0.insert(t.clone());
        t
    }

    /// A value lets go of `text`: forgotten here when no other value
    /// holds it.
    pub fn release(&mut self, text: Arc<str>) {
        // Values are only dropped under the cache's write lock and
        // readers copy texts out, so the set and `text` are the only
        // holders when no other value shares it.
        if Arc::strong_count(&text) <= 2 {
            self.0.remove(&*text);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

struct Entry<V> {
    /// `<namespace>/<name>` (neither may contain `/`).
    key: Box<str>,
    value: V,
}

fn compare(key: &str, namespace: &str, name: &str) -> Ordering {
    let (ns, n) = key.split_once('/').unwrap_or((key, ""));
    (ns, n).cmp(&(namespace, name))
}

fn make_key(namespace: &str, name: &str) -> Box<str> {
    let mut k = String::with_capacity(namespace.len() + 1 + name.len());
    k.push_str(namespace);
    k.push('/');
    k.push_str(name);
    k.into_boxed_str()
}

struct Entries<V> {
    sorted: Vec<Entry<V>>,
    texts: Texts,
}

impl<V> Default for Entries<V> {
    fn default() -> Self {
        Self {
            sorted: Vec::new(),
            texts: Texts::default(),
        }
    }
}

impl<V> Entries<V> {
    fn find(&self, namespace: &str, name: &str) -> Result<usize, usize> {
        self.sorted
            .binary_search_by(|e| compare(&e.key, namespace, name))
    }
}

/// The objects of one watch, as their slim values.
pub struct Cache<V> {
    entries: RwLock<Entries<V>>,
}

impl<V> Default for Cache<V> {
    fn default() -> Self {
        Self {
            entries: RwLock::new(Entries::default()),
        }
    }
}

impl<V> Cache<V> {
    /// `f` of the value of `namespace/name`, if the cache holds it.
    pub fn get<R>(&self, namespace: &str, name: &str, f: impl FnOnce(&V) -> R) -> Option<R> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let i = entries.find(namespace, name).ok()?;
        Some(f(&entries.sorted[i].value))
    }

    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.sorted.len()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Entries<V>> {
        self.entries.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The first `Some` that `f` gives of the values, in key order: a
    /// scan, for small caches looked up by something else than the key.
    pub fn find_map<R>(&self, f: impl FnMut(&V) -> Option<R>) -> Option<R> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.sorted.iter().map(|e| &e.value).find_map(f)
    }
}

/// Applies one watch's events to its cache.
pub struct Feeder<K: Slim> {
    cache: Arc<Cache<K::Value>>,
    /// Between `Init` and `InitDone`: the list so far.
    listing: Option<Entries<K::Value>>,
}

impl<K: Slim> Feeder<K> {
    pub fn new(cache: Arc<Cache<K::Value>>) -> Self {
        Self {
            cache,
            listing: None,
        }
    }

    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Applies `event`; true when it completed a list (`InitDone`).
    pub fn apply(&mut self, event: watcher::Event<K>) -> bool {
        match event {
            watcher::Event::Init => {
                self.listing = Some(Entries::default());
                false
            }
            watcher::Event::InitApply(object) => {
                let listing = self.listing.get_or_insert_with(Entries::default);
                let key = {
                    let (namespace, name) = object.key();
                    make_key(namespace, name)
                };
                let value = object.into_value(&mut listing.texts);
                listing.sorted.push(Entry { key, value });
                false
            }
            watcher::Event::InitDone => {
                let mut listed = self.listing.take().unwrap_or_default();
                finish(&mut listed);
                let old = {
                    let mut entries = self.cache.write();
                    std::mem::replace(&mut *entries, listed)
                };
                // The old values go with their own texts: nothing to give
                // back, and dropped outside the lock.
                drop(old);
                true
            }
            watcher::Event::Apply(object) => {
                let mut entries = self.cache.write();
                let entries = &mut *entries;
                let (namespace, name) = object.key();
                match entries.find(namespace, name) {
                    Ok(i) => {
                        let value = object.into_value(&mut entries.texts);
                        let old = std::mem::replace(&mut entries.sorted[i].value, value);
                        K::release(old, &mut entries.texts);
                    }
                    Err(i) => {
                        let key = make_key(namespace, name);
                        let value = object.into_value(&mut entries.texts);
                        entries.sorted.insert(i, Entry { key, value });
                    }
                }
                false
            }
            watcher::Event::Delete(object) => {
                let mut entries = self.cache.write();
                let entries = &mut *entries;
                let (namespace, name) = object.key();
                if let Ok(i) = entries.find(namespace, name) {
                    let gone = entries.sorted.remove(i);
                    K::release(gone.value, &mut entries.texts);
                }
                false
            }
        }
    }
}

/// A finished list: sorted (the API server lists in this order already),
/// an object listed twice kept once with its later value, no spare room.
fn finish<V>(listed: &mut Entries<V>) {
    let order = |a: &Entry<V>, b: &Entry<V>| {
        let (ns, n) = b.key.split_once('/').unwrap_or((&b.key, ""));
        compare(&a.key, ns, n)
    };
    if !listed
        .sorted
        .windows(2)
        .all(|w| order(&w[0], &w[1]) == Ordering::Less)
    {
        listed.sorted.sort_by(order);
        // Stable: of equal keys the later one is last; keep its value.
        // (A dropped duplicate's texts stay in the set until the next
        // list: an API server lists each object once.)
        listed.sorted.dedup_by(|later, kept| {
            let same = later.key == kept.key;
            if same {
                std::mem::swap(&mut later.value, &mut kept.value);
            }
            same
        });
    }
    listed.sorted.shrink_to_fit();
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
