//! What the layers above core report through a context's recorder (issue #42: observability
//! flows upward). Core knows nothing of memory servers, stores or any other layer: each
//! registers a [`Source`] with the recorder of the context it runs on, and a snapshot reads
//! the live ones into [`Section`]s, which the Prometheus and JSON renderings show without
//! knowing what they are. A source whose object was dropped answers `None` and leaves the
//! listing at the next snapshot.

use parking_lot::Mutex;

/// Whether a series only grows, or goes up and down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesKind {
    /// Only grows (Prometheus `counter`; its metric name ends in `_total`).
    Counter,
    /// Goes up and down (Prometheus `gauge`).
    Gauge,
}

/// One value of a [`Section`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// Its member's name in the JSON snapshot's object (`leases`).
    pub key: &'static str,
    /// Its Prometheus metric, without the `rdmapool_` prefix (`pool_server_leases`).
    pub metric: &'static str,
    /// Counter or gauge.
    pub kind: SeriesKind,
    /// The metric's help text.
    pub help: &'static str,
    /// The value now.
    pub value: u64,
}

/// One object's values, as a layer above core reports them: one memory server, one store
/// client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The family: its key in the JSON snapshot, where its sections are an array of objects
    /// (`pool_servers`).
    pub family: &'static str,
    /// The label the family's sections differ by, and this one's value (`node`, 3): a
    /// Prometheus label, and the first member of the section's JSON object.
    pub label: (&'static str, u64),
    /// Its values, in the order they are shown.
    pub series: Vec<Series>,
}

/// Reads one object's section; `None` once the object is gone.
pub type Source = Box<dyn Fn() -> Option<Section> + Send + Sync>;

/// The sources registered with one recorder.
#[derive(Default)]
pub struct Sources(Mutex<Vec<Source>>);

impl Sources {
    /// Lists `source` while it answers (a layer calls this when it starts an object it
    /// reports on, with a source that holds the object weakly).
    pub fn register(&self, source: Source) {
        self.0.lock().push(source);
    }
}

/// The sections of the live sources of these listings, by family then label; sections of
/// one family and label (two objects reporting under one label) are added up; forgets the
/// sources that are gone.
pub(super) fn snapshot<'a>(listings: impl Iterator<Item = &'a Sources>) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    for l in listings {
        l.0.lock().retain(|source| match source() {
            Some(s) => {
                match out
                    .iter_mut()
                    .find(|o| o.family == s.family && o.label == s.label)
                {
                    Some(o) => {
                        for (a, b) in o.series.iter_mut().zip(&s.series) {
                            a.value = a.value.wrapping_add(b.value);
                        }
                    }
                    None => out.push(s),
                }
                true
            }
            None => false,
        });
    }
    out.sort_by(|a, b| (a.family, a.label.1).cmp(&(b.family, b.label.1)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(family: &'static str, label: u64, value: u64) -> Section {
        Section {
            family,
            label: ("id", label),
            series: vec![Series {
                key: "n",
                metric: "test_n_total",
                kind: SeriesKind::Counter,
                help: "A test count.",
                value,
            }],
        }
    }

    #[test]
    fn live_sources_are_listed_sorted_and_summed_and_gone_ones_forgotten() {
        let s = Sources::default();
        let alive = std::sync::Arc::new(());
        let weak = std::sync::Arc::downgrade(&alive);
        s.register(Box::new(move || weak.upgrade().map(|_| section("b", 2, 5))));
        s.register(Box::new(|| Some(section("a", 9, 1))));
        s.register(Box::new(|| Some(section("b", 2, 7))));
        let got = snapshot([&s].into_iter());
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].family, got[1].family), ("a", "b"));
        assert_eq!(got[1].series[0].value, 12, "one family and label: added up");
        drop(alive);
        let got = snapshot([&s].into_iter());
        assert_eq!(got[1].series[0].value, 7);
        assert_eq!(s.0.lock().len(), 2, "the gone source is forgotten");
    }
}
