//! The durable Raft log, vote and snapshot, in one redb database per node, and the state machine
//! store over [`ClusterState`].
//!
//! `<data_dir>/raft.redb` holds three tables: `log` (index -> JSON entry), `meta` (the vote, the
//! committed log id, the last purged log id) and `snapshot` (the current snapshot's meta and
//! bytes). Every write is a redb transaction committed with `Durability::Immediate` (fsync)
//! before openraft is told it is done, so an acknowledged entry survives SIGKILL. The state
//! machine itself is in memory: at start it is rebuilt from the stored snapshot, and openraft
//! re-applies the committed entries after it (we persist the committed log id for that).
//!
//! redb calls block (they fsync), so they run on the blocking pool.

// openraft's StorageError is large, and it is the error type its traits require.
#![allow(clippy::result_large_err)]

use crate::TypeConfig;
use crate::state::{ClusterState, Command, Response};
use crate::typ;
use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, EntryPayload, LogId, LogState, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::{Arc, RwLock};
use tokio::sync::watch;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");

const VOTE_KEY: &str = "vote";
const COMMITTED_KEY: &str = "committed";
const PURGED_KEY: &str = "purged";
const SNAPSHOT_META_KEY: &str = "meta";
const SNAPSHOT_DATA_KEY: &str = "data";

type StoreResult<T> = Result<T, StorageError<u64>>;

fn io_err(e: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::write(AnyError::new(&e)).into()
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::read(AnyError::new(&e)).into()
}

/// Opens (or creates) the node's database, `<dir>/raft.redb`.
pub fn open_database(dir: &Path) -> Result<Arc<Database>, crate::Error> {
    std::fs::create_dir_all(dir).map_err(|source| crate::Error::DataDir { path: dir.into(), source })?;
    let path = dir.join("raft.redb");
    let db = Database::create(&path).map_err(|e| crate::Error::Storage {
        path: path.clone(),
        reason: format!("{e}; is another coordinator using this --data-dir?"),
    })?;
    let txn =
        db.begin_write().map_err(|e| crate::Error::Storage { path: path.clone(), reason: e.to_string() })?;
    for open in [
        |t: &redb::WriteTransaction| t.open_table(LOG).map(drop),
        |t: &redb::WriteTransaction| t.open_table(META).map(drop),
        |t: &redb::WriteTransaction| t.open_table(SNAPSHOT).map(drop),
    ] {
        open(&txn).map_err(|e| crate::Error::Storage { path: path.clone(), reason: e.to_string() })?;
    }
    txn.commit().map_err(|e| crate::Error::Storage { path, reason: e.to_string() })?;
    Ok(Arc::new(db))
}

/// Runs a blocking redb operation off the async threads.
async fn blocking<T: Send + 'static>(
    db: &Arc<Database>,
    f: impl FnOnce(&Database) -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    let db = db.clone();
    tokio::task::spawn_blocking(move || f(&db)).await.map_err(io_err)?
}

fn get_meta<T: for<'de> Deserialize<'de>>(db: &Database, key: &str) -> StoreResult<Option<T>> {
    let txn = db.begin_read().map_err(read_err)?;
    let table = txn.open_table(META).map_err(read_err)?;
    match table.get(key).map_err(read_err)? {
        Some(bytes) => serde_json::from_slice(bytes.value()).map(Some).map_err(read_err),
        None => Ok(None),
    }
}

fn put_meta(db: &Database, key: &str, value: &impl Serialize) -> StoreResult<()> {
    let bytes = serde_json::to_vec(value).map_err(io_err)?;
    let txn = db.begin_write().map_err(io_err)?;
    txn.open_table(META).map_err(io_err)?.insert(key, bytes.as_slice()).map_err(io_err)?;
    txn.commit().map_err(io_err)
}

/// The Raft log and vote.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    /// The log in `db`.
    pub fn new(db: Arc<Database>) -> Self {
        Self { db }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<typ::Entry>> {
        let (start, end) = (range.start_bound().cloned(), range.end_bound().cloned());
        blocking(&self.db, move |db| {
            let txn = db.begin_read().map_err(read_err)?;
            let table = txn.open_table(LOG).map_err(read_err)?;
            let mut out = Vec::new();
            for item in table.range::<u64>((start, end)).map_err(read_err)? {
                let (_, value) = item.map_err(read_err)?;
                out.push(serde_json::from_slice(value.value()).map_err(read_err)?);
            }
            Ok(out)
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        blocking(&self.db, |db| {
            let last_purged: Option<LogId<u64>> = get_meta(db, PURGED_KEY)?;
            let txn = db.begin_read().map_err(read_err)?;
            let table = txn.open_table(LOG).map_err(read_err)?;
            let last = match table.last().map_err(read_err)? {
                Some((_, value)) => {
                    let entry: typ::Entry = serde_json::from_slice(value.value()).map_err(read_err)?;
                    Some(entry.log_id)
                }
                None => last_purged,
            };
            Ok(LogState { last_purged_log_id: last_purged, last_log_id: last })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> StoreResult<()> {
        let vote = *vote;
        blocking(&self.db, move |db| put_meta(db, VOTE_KEY, &vote)).await
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<u64>>> {
        blocking(&self.db, |db| get_meta(db, VOTE_KEY)).await
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> StoreResult<()> {
        blocking(&self.db, move |db| put_meta(db, COMMITTED_KEY, &committed)).await
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<u64>>> {
        blocking(&self.db, |db| Ok(get_meta::<Option<LogId<u64>>>(db, COMMITTED_KEY)?.flatten())).await
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = typ::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        for entry in entries {
            encoded.push((entry.log_id.index, serde_json::to_vec(&entry).map_err(io_err)?));
        }
        let result = blocking(&self.db, move |db| {
            let txn = db.begin_write().map_err(io_err)?;
            {
                let mut table = txn.open_table(LOG).map_err(io_err)?;
                for (index, bytes) in &encoded {
                    table.insert(*index, bytes.as_slice()).map_err(io_err)?;
                }
            }
            // Inserted but not committed: a crash here must leave the log as it was before.
            fault::fail_point!("coordinator::raft_log_append");
            txn.commit().map_err(io_err)
        })
        .await;
        callback
            .log_io_completed(result.as_ref().map(|_| ()).map_err(|e| std::io::Error::other(e.to_string())));
        result
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StoreResult<()> {
        blocking(&self.db, move |db| {
            let txn = db.begin_write().map_err(io_err)?;
            txn.open_table(LOG).map_err(io_err)?.retain_in(log_id.index.., |_, _| false).map_err(io_err)?;
            txn.commit().map_err(io_err)
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StoreResult<()> {
        blocking(&self.db, move |db| {
            let bytes = serde_json::to_vec(&Some(log_id)).map_err(io_err)?;
            let txn = db.begin_write().map_err(io_err)?;
            txn.open_table(META).map_err(io_err)?.insert(PURGED_KEY, bytes.as_slice()).map_err(io_err)?;
            txn.open_table(LOG).map_err(io_err)?.retain_in(..=log_id.index, |_, _| false).map_err(io_err)?;
            txn.commit().map_err(io_err)
        })
        .await
    }
}

/// The state machine and what a snapshot of it holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StateMachine {
    /// The last entry applied.
    pub last_applied: Option<LogId<u64>>,
    /// The last membership applied.
    pub last_membership: StoredMembership<u64, openraft::BasicNode>,
    /// The application state.
    pub state: ClusterState,
}

/// A command applied live, for the run recorder and the waiters of the leader.
#[derive(Debug, Clone)]
pub struct Applied {
    /// Its log index.
    pub index: u64,
    /// The command.
    pub command: Arc<Command>,
    /// What applying it gave.
    pub response: Response,
}

/// The state machine shared between the Raft store and the gRPC services, which read it.
pub struct Shared {
    /// The state; a std lock: it is held only for short, non-async sections.
    pub machine: RwLock<StateMachine>,
    /// The index of the last applied entry, for waiters (KV gets, watches).
    pub applied: watch::Sender<u64>,
    /// Commands as they are applied (bounded; a slow receiver lags and skips).
    pub commands: tokio::sync::broadcast::Sender<Applied>,
}

impl Shared {
    fn new(machine: StateMachine) -> Arc<Self> {
        let index = machine.last_applied.map_or(0, |l| l.index);
        Arc::new(Self {
            machine: RwLock::new(machine),
            applied: watch::channel(index).0,
            commands: tokio::sync::broadcast::channel(4096).0,
        })
    }

    /// Reads the cluster state.
    pub fn read<T>(&self, f: impl FnOnce(&ClusterState) -> T) -> T {
        f(&self.machine.read().unwrap_or_else(|e| e.into_inner()).state)
    }
}

/// The state machine store: applies entries, builds and installs snapshots.
#[derive(Clone)]
pub struct StateMachineStore {
    db: Arc<Database>,
    shared: Arc<Shared>,
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshotMeta {
    meta: SnapshotMeta<u64, openraft::BasicNode>,
}

impl StateMachineStore {
    /// The state machine over `db`, restored from the snapshot stored there if any.
    pub fn open(db: Arc<Database>) -> Result<Self, crate::Error> {
        let restore = || -> StoreResult<StateMachine> {
            let txn = db.begin_read().map_err(read_err)?;
            let table = txn.open_table(SNAPSHOT).map_err(read_err)?;
            match table.get(SNAPSHOT_DATA_KEY).map_err(read_err)? {
                Some(bytes) => serde_json::from_slice(bytes.value()).map_err(read_err),
                None => Ok(StateMachine::default()),
            }
        };
        let machine = restore().map_err(|e| crate::Error::Storage {
            path: "raft.redb".into(),
            reason: format!("cannot restore the snapshot: {e}"),
        })?;
        Ok(Self { db, shared: Shared::new(machine) })
    }

    /// The state the services read.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    fn store_snapshot(
        db: &Database,
        meta: &SnapshotMeta<u64, openraft::BasicNode>,
        data: &[u8],
    ) -> StoreResult<()> {
        let meta = serde_json::to_vec(&StoredSnapshotMeta { meta: meta.clone() }).map_err(io_err)?;
        let txn = db.begin_write().map_err(io_err)?;
        {
            let mut table = txn.open_table(SNAPSHOT).map_err(io_err)?;
            table.insert(SNAPSHOT_META_KEY, meta.as_slice()).map_err(io_err)?;
            table.insert(SNAPSHOT_DATA_KEY, data).map_err(io_err)?;
        }
        txn.commit().map_err(io_err)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StoreResult<typ::Snapshot> {
        let (data, meta) = {
            let machine = self.shared.machine.read().unwrap_or_else(|e| e.into_inner());
            let data = serde_json::to_vec(&*machine).map_err(io_err)?;
            let last = machine.last_applied;
            let snapshot_id = match last {
                Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, crc_hex(&data)),
                None => format!("empty-{}", crc_hex(&data)),
            };
            let meta = SnapshotMeta {
                last_log_id: last,
                last_membership: machine.last_membership.clone(),
                snapshot_id,
            };
            (data, meta)
        };
        let (stored_meta, stored_data) = (meta.clone(), data.clone());
        blocking(&self.db, move |db| Self::store_snapshot(db, &stored_meta, &stored_data)).await?;
        Ok(typ::Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

fn crc_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(data)[..4])
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> StoreResult<(Option<LogId<u64>>, StoredMembership<u64, openraft::BasicNode>)> {
        let machine = self.shared.machine.read().unwrap_or_else(|e| e.into_inner());
        Ok((machine.last_applied, machine.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<Response>>
    where
        I: IntoIterator<Item = typ::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut responses = Vec::new();
        let mut applied = Vec::new();
        let last_index = {
            let mut machine = self.shared.machine.write().unwrap_or_else(|e| e.into_inner());
            for entry in entries {
                // Committed but not applied (or a batch half applied): the machine is rebuilt
                // from the snapshot and the committed log at the next start.
                fault::fail_point!("coordinator::state_machine_apply");
                machine.last_applied = Some(entry.log_id);
                let response = match entry.payload {
                    EntryPayload::Blank => Response::Applied,
                    EntryPayload::Normal(command) => {
                        let command = Arc::new(command);
                        let response = machine.state.apply((*command).clone());
                        applied.push(Applied {
                            index: entry.log_id.index,
                            command,
                            response: response.clone(),
                        });
                        response
                    }
                    EntryPayload::Membership(membership) => {
                        machine.last_membership = StoredMembership::new(Some(entry.log_id), membership);
                        Response::Applied
                    }
                };
                responses.push(response);
            }
            // Queued before the lock is released: whoever reads the new state finds its
            // commands already queued (local mode stops the node, and its recorder drains
            // the queue, as soon as it reads that the job ended). Nobody listening is fine.
            for a in applied {
                let _ = self.shared.commands.send(a);
            }
            machine.last_applied.map_or(0, |l| l.index)
        };
        self.shared.applied.send_replace(last_index);
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StoreResult<()> {
        let data = snapshot.into_inner();
        let machine: StateMachine = serde_json::from_slice(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), AnyError::new(&e)))?;
        let stored_meta = meta.clone();
        blocking(&self.db, move |db| Self::store_snapshot(db, &stored_meta, &data)).await?;
        let index = machine.last_applied.map_or(0, |l| l.index);
        *self.shared.machine.write().unwrap_or_else(|e| e.into_inner()) = machine;
        self.shared.applied.send_replace(index);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<typ::Snapshot>> {
        blocking(&self.db, |db| {
            let txn = db.begin_read().map_err(read_err)?;
            let table = txn.open_table(SNAPSHOT).map_err(read_err)?;
            let (Some(meta), Some(data)) = (
                table.get(SNAPSHOT_META_KEY).map_err(read_err)?,
                table.get(SNAPSHOT_DATA_KEY).map_err(read_err)?,
            ) else {
                return Ok(None);
            };
            let stored: StoredSnapshotMeta = serde_json::from_slice(meta.value()).map_err(read_err)?;
            Ok(Some(typ::Snapshot {
                meta: stored.meta,
                snapshot: Box::new(Cursor::new(data.value().to_vec())),
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::{StoreBuilder, Suite};

    struct RedbBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for RedbBuilder {
        async fn build(&self) -> StoreResult<(tempfile::TempDir, LogStore, StateMachineStore)> {
            let dir = tempfile::tempdir().map_err(io_err)?;
            let db = open_database(dir.path()).map_err(io_err)?;
            let sm = StateMachineStore::open(db.clone()).map_err(io_err)?;
            Ok((dir, LogStore::new(db), sm))
        }
    }

    #[test]
    fn openraft_storage_suite_passes() {
        Suite::test_all(RedbBuilder).unwrap();
    }

    #[tokio::test]
    async fn the_log_vote_and_snapshot_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let vote = Vote::new(3, 1);
        let snapshot_bytes = {
            let db = open_database(dir.path()).unwrap();
            let mut log = LogStore::new(db.clone());
            log.save_vote(&vote).await.unwrap();
            let mut sm = StateMachineStore::open(db).unwrap();
            let entry = typ::Entry {
                log_id: LogId::new(openraft::CommittedLeaderId::new(3, 1), 1),
                payload: EntryPayload::Normal(crate::state::Command::KvPut {
                    job_id: "none".into(),
                    key: "k".into(),
                    value: vec![1],
                    generation: None,
                }),
            };
            sm.apply([entry]).await.unwrap();
            let snapshot = sm.build_snapshot().await.unwrap();
            snapshot.snapshot.into_inner()
        };
        let db = open_database(dir.path()).unwrap();
        assert_eq!(LogStore::new(db.clone()).read_vote().await.unwrap(), Some(vote));
        let mut sm = StateMachineStore::open(db).unwrap();
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(1));
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.snapshot.into_inner(), snapshot_bytes);
    }
}
