//! The tables the features plan beside the main one ([`ExtraTables`]): an engine per table,
//! keyed by family and name, each synced on its own. A table a feature declares
//! ([`crate::plan::extra_tables`]) that no plan holds is deleted if the kernel holds it (read
//! back once after each invalidation, so a leftover goes too).

use std::collections::BTreeMap;

use crate::nft::ir::Table;
use crate::nft::{ApplyStats, Engine, Family, NftBackend, NftError};
use crate::plan::ExtraTables;

/// One table's engine, and whether the kernel is known to hold no such table (since the
/// last invalidation).
struct Extra<N: NftBackend> {
    engine: Engine<N>,
    absent: bool,
}

impl<N: NftBackend + Default> Extra<N> {
    fn new() -> Self {
        Extra {
            engine: Engine::new(N::default()),
            absent: false,
        }
    }
}

/// The engines of the tables beside the main one.
pub(super) struct ExtraEngines<N: NftBackend> {
    engines: BTreeMap<(Family, String), Extra<N>>,
}

impl<N: NftBackend + Default> ExtraEngines<N> {
    /// Engines for the `declared` tables (deleted while no plan holds them).
    pub(super) fn new(declared: &[(Family, &str)]) -> Self {
        let engines = declared
            .iter()
            .map(|(family, name)| ((*family, name.to_string()), Extra::new()))
            .collect();
        ExtraEngines { engines }
    }

    /// Brings each table to `planned`: a planned table is synced, a declared one not planned
    /// deleted. A failed removal counts in `cleanup_failures`; the first error stops the sync.
    pub(super) fn sync(
        &mut self,
        mut planned: ExtraTables,
        cleanup_failures: &mut u64,
    ) -> Result<ApplyStats, NftError> {
        for table in planned.iter() {
            let key = (table.family, table.name.clone());
            self.engines.entry(key).or_insert_with(Extra::new);
        }
        let mut stats = ApplyStats::default();
        for ((family, name), extra) in &mut self.engines {
            stats += match planned.remove(*family, name) {
                Some(table) => {
                    extra.absent = false;
                    extra.engine.sync(table)?
                }
                None if extra.absent => ApplyStats::default(),
                None => {
                    let deleted = delete_held(&mut extra.engine, *family, name)
                        .inspect_err(|_| *cleanup_failures += 1)?;
                    extra.absent = true;
                    deleted
                }
            };
        }
        Ok(stats)
    }

    /// The tables the kernel holds as far as the engines know.
    pub(super) fn applied(&self) -> Vec<&Table> {
        self.engines
            .values()
            .filter_map(|e| e.engine.current())
            .collect()
    }

    /// Forces the next sync to read every table back.
    pub(super) fn invalidate(&mut self) {
        for extra in self.engines.values_mut() {
            extra.engine.invalidate();
            extra.absent = false;
        }
    }

    /// The engine of `family`/`name` (tests look at its backend).
    #[cfg(test)]
    pub(super) fn engine_mut(&mut self, family: Family, name: &str) -> &mut Engine<N> {
        &mut self
            .engines
            .entry((family, name.to_string()))
            .or_insert_with(Extra::new)
            .engine
    }
}

/// Deletes `table <family> <name>` if the kernel holds it.
fn delete_held<N: NftBackend>(
    engine: &mut Engine<N>,
    family: Family,
    name: &str,
) -> Result<ApplyStats, NftError> {
    let none = Table::with_family(family, name);
    let held = engine.current().is_some() || engine.backend_mut().read_back(&none)?.table.is_some();
    if held {
        engine.delete_table(family, name)
    } else {
        Ok(ApplyStats::default())
    }
}
