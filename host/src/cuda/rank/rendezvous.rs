//! The metadata exchange among the ranks of one tensor-parallel group.
//!
//! [`Rendezvous`] is the one thing the per-rank mode asks of its caller: all-gather some
//! bytes among the ranks (a barrier is an all-gather of nothing). Frameworks already have one —
//! the PyTorch package implements it with `torch.distributed.all_gather_object`, which also
//! spans hosts. [`LocalRendezvous`] is the Rust one for processes on one host: a Unix-domain
//! socket at a path the ranks agree on, rank 0 in the middle.
//!
//! Wire format of [`LocalRendezvous`] (little-endian, one frame per message):
//! `u64 sequence · u32 count · count × (u64 length · bytes)`. A rank sends its contribution as
//! a frame of count 1; rank 0 answers every rank with the frame of all contributions in rank
//! order. The sequence number catches ranks whose collective calls went out of step. Every
//! read and write is bounded by the rendezvous timeout, and a frame above
//! [`MAX_FRAME_BYTES`] is refused, so a dead or confused peer becomes an error, never a hang.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A rendezvous failure: a peer that never joined or died, a timeout, a protocol mismatch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("rendezvous: {message}")]
pub struct RendezvousError {
    /// What happened, for a person.
    pub message: String,
}

impl RendezvousError {
    /// An error with `message`.
    #[must_use]
    pub fn new(message: impl Into<String>) -> Self {
        RendezvousError {
            message: message.into(),
        }
    }
}

/// The small metadata exchange among the ranks of one group. Every call is collective: all
/// ranks make the same calls in the same order.
pub trait Rendezvous: Send + Sync {
    /// This process's rank, `0..world_size()`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world_size(&self) -> usize;
    /// Every rank contributes `mine`; returns every rank's bytes, index = rank.
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, RendezvousError>;
}

/// Largest frame [`LocalRendezvous`] accepts (the handshake needs a few kilobytes).
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// A [`Rendezvous`] for processes on one host over a Unix-domain socket; see the module
/// documentation.
#[derive(Debug)]
pub struct LocalRendezvous {
    rank: usize,
    world: usize,
    timeout: Duration,
    sequence: AtomicU64,
    links: Mutex<Links>,
    /// The socket file rank 0 created (removed on drop).
    socket: Option<PathBuf>,
}

#[derive(Debug)]
enum Links {
    /// Rank 0: one stream per other rank, index = rank − 1.
    Root(Vec<UnixStream>),
    /// Another rank: its stream to rank 0.
    Leaf(UnixStream),
    /// World size 1.
    Alone,
}

fn io_error(what: &str) -> impl FnOnce(std::io::Error) -> RendezvousError + '_ {
    move |e| RendezvousError::new(format!("{what}: {e}"))
}

impl LocalRendezvous {
    /// Joins the group whose rank 0 listens at `socket` (rank 0 creates it; a stale file is
    /// replaced). Waits up to `timeout` for every rank to join (rank 0) or for rank 0 to
    /// listen (the others); the same bound applies to every later exchange.
    pub fn join(
        socket: &Path,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<Self, RendezvousError> {
        if world == 0 || rank >= world {
            return Err(RendezvousError::new(format!(
                "rank {rank} is not in a group of {world}"
            )));
        }
        let deadline = Instant::now() + timeout;
        let (links, created) = if world == 1 {
            (Links::Alone, None)
        } else if rank == 0 {
            (
                Links::Root(accept_all(socket, world, deadline, timeout)?),
                Some(socket.to_path_buf()),
            )
        } else {
            (
                Links::Leaf(connect(socket, rank, world, deadline, timeout)?),
                None,
            )
        };
        Ok(LocalRendezvous {
            rank,
            world,
            timeout,
            sequence: AtomicU64::new(0),
            links: Mutex::new(links),
            socket: created,
        })
    }
}

impl Drop for LocalRendezvous {
    fn drop(&mut self) {
        if let Some(path) = &self.socket {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Rank 0: listens at `socket` and accepts the other `world − 1` ranks, each introducing
/// itself with a frame `[rank, world]`.
fn accept_all(
    socket: &Path,
    world: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<UnixStream>, RendezvousError> {
    if socket.exists() {
        std::fs::remove_file(socket).map_err(io_error("removing a stale rendezvous socket"))?;
    }
    let listener = UnixListener::bind(socket).map_err(io_error("binding the rendezvous socket"))?;
    listener
        .set_nonblocking(true)
        .map_err(io_error("rendezvous socket"))?;
    let mut slots: Vec<Option<UnixStream>> = (1..world).map(|_| None).collect();
    while slots.iter().any(Option::is_none) {
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .map_err(io_error("rendezvous socket"))?;
                set_timeouts(&stream, timeout)?;
                let hello = read_frame(&mut stream, 0)?;
                let (their_rank, their_world) = parse_hello(&hello)?;
                if their_world != world {
                    return Err(RendezvousError::new(format!(
                        "rank {their_rank} joined a group of {their_world}, rank 0 one of {world}"
                    )));
                }
                let slot = their_rank
                    .checked_sub(1)
                    .and_then(|i| slots.get_mut(i))
                    .ok_or_else(|| {
                        RendezvousError::new(format!(
                            "rank {their_rank} is not in a group of {world}"
                        ))
                    })?;
                if slot.is_some() {
                    return Err(RendezvousError::new(format!(
                        "two processes joined as rank {their_rank}"
                    )));
                }
                *slot = Some(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = slots
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| s.is_none())
                        .map(|(i, _)| (i + 1).to_string())
                        .collect();
                    return Err(RendezvousError::new(format!(
                        "rank(s) {} did not join within {timeout:?}",
                        missing.join(", ")
                    )));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(io_error("accepting a rank")(e)),
        }
    }
    Ok(slots.into_iter().flatten().collect())
}

/// Another rank: connects to rank 0 (retrying until `deadline`) and introduces itself.
fn connect(
    socket: &Path,
    rank: usize,
    world: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<UnixStream, RendezvousError> {
    let mut stream = loop {
        match UnixStream::connect(socket) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => {
                return Err(RendezvousError::new(format!(
                    "rank 0 did not listen at {} within {timeout:?} ({e})",
                    socket.display()
                )));
            }
        }
    };
    set_timeouts(&stream, timeout)?;
    let hello = [rank as u64, world as u64]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect::<Vec<u8>>();
    write_frame(&mut stream, 0, &[hello.as_slice()])?;
    Ok(stream)
}

fn set_timeouts(stream: &UnixStream, timeout: Duration) -> Result<(), RendezvousError> {
    let t = Some(timeout.max(Duration::from_millis(1)));
    stream
        .set_read_timeout(t)
        .and_then(|()| stream.set_write_timeout(t))
        .map_err(io_error("rendezvous socket"))
}

fn parse_hello(frame: &[Vec<u8>]) -> Result<(usize, usize), RendezvousError> {
    let bad = || RendezvousError::new("a rank sent a malformed introduction");
    let body = frame.first().filter(|b| b.len() == 16).ok_or_else(bad)?;
    let word = |i: usize| -> usize {
        let mut b = [0u8; 8];
        b.copy_from_slice(&body[8 * i..8 * i + 8]);
        usize::try_from(u64::from_le_bytes(b)).unwrap_or(usize::MAX)
    };
    Ok((word(0), word(1)))
}

/// Writes one frame of `parts` with `sequence`.
fn write_frame(
    stream: &mut UnixStream,
    sequence: u64,
    parts: &[&[u8]],
) -> Result<(), RendezvousError> {
    let mut out = Vec::with_capacity(12 + parts.iter().map(|p| 8 + p.len()).sum::<usize>());
    out.extend_from_slice(&sequence.to_le_bytes());
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for p in parts {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p);
    }
    if out.len() > MAX_FRAME_BYTES {
        return Err(RendezvousError::new(format!(
            "a frame of {} bytes exceeds the {MAX_FRAME_BYTES}-byte limit",
            out.len()
        )));
    }
    stream
        .write_all(&out)
        .map_err(io_error("sending to a rank (did it exit?)"))
}

/// Reads one frame, checking its sequence number.
fn read_frame(stream: &mut UnixStream, sequence: u64) -> Result<Vec<Vec<u8>>, RendezvousError> {
    let lost = io_error("receiving from a rank (did it exit or stall?)");
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).map_err(lost)?;
    let got = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
    let count = u32::from_le_bytes(head[8..].try_into().unwrap_or_default()) as usize;
    if got != sequence {
        return Err(RendezvousError::new(format!(
            "ranks are out of step: exchange {got} met exchange {sequence} (every rank must \
             make the same collective calls in the same order)"
        )));
    }
    let mut total = 12usize;
    let mut parts = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let mut len = [0u8; 8];
        stream
            .read_exact(&mut len)
            .map_err(io_error("receiving from a rank"))?;
        let len = usize::try_from(u64::from_le_bytes(len)).unwrap_or(usize::MAX);
        total = total.saturating_add(8).saturating_add(len);
        if total > MAX_FRAME_BYTES {
            return Err(RendezvousError::new(format!(
                "a rank sent a frame above the {MAX_FRAME_BYTES}-byte limit"
            )));
        }
        let mut body = vec![0u8; len];
        stream
            .read_exact(&mut body)
            .map_err(io_error("receiving from a rank"))?;
        parts.push(body);
    }
    Ok(parts)
}

impl Rendezvous for LocalRendezvous {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, RendezvousError> {
        let mut links = self
            .links
            .lock()
            .map_err(|_| RendezvousError::new("a previous exchange panicked"))?;
        // Numbered under the lock, so concurrent callers send in the order they number.
        let sequence = self.sequence.fetch_add(1, Ordering::SeqCst) + 1;
        match &mut *links {
            Links::Alone => Ok(vec![mine.to_vec()]),
            Links::Leaf(stream) => {
                write_frame(stream, sequence, &[mine])?;
                let all = read_frame(stream, sequence)?;
                if all.len() != self.world {
                    return Err(RendezvousError::new(format!(
                        "rank 0 answered with {} contributions for {} ranks",
                        all.len(),
                        self.world
                    )));
                }
                Ok(all)
            }
            Links::Root(streams) => {
                let mut all = Vec::with_capacity(self.world);
                all.push(mine.to_vec());
                for (i, stream) in streams.iter_mut().enumerate() {
                    let mut frame = read_frame(stream, sequence).map_err(|e| {
                        RendezvousError::new(format!("rank {}: {}", i + 1, e.message))
                    })?;
                    if frame.len() != 1 {
                        return Err(RendezvousError::new(format!(
                            "rank {} sent {} contributions",
                            i + 1,
                            frame.len()
                        )));
                    }
                    all.push(frame.remove(0));
                }
                let parts: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
                for (i, stream) in streams.iter_mut().enumerate() {
                    write_frame(stream, sequence, &parts).map_err(|e| {
                        RendezvousError::new(format!("rank {}: {}", i + 1, e.message))
                    })?;
                }
                Ok(all)
            }
        }
    }
}

impl LocalRendezvous {
    /// The bound of every exchange.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn socket(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("distgemm-rv-{}-{name}.sock", std::process::id()))
    }

    fn group(name: &str, world: usize) -> Vec<LocalRendezvous> {
        let path = socket(name);
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let path = path.clone();
                std::thread::spawn(move || {
                    LocalRendezvous::join(&path, rank, world, Duration::from_secs(5))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    }

    #[test]
    fn every_rank_gets_every_contribution_in_rank_order() {
        let ranks: Vec<Arc<LocalRendezvous>> =
            group("gather", 4).into_iter().map(Arc::new).collect();
        for round in 0..3u8 {
            let handles: Vec<_> = ranks
                .iter()
                .map(|r| {
                    let r = Arc::clone(r);
                    std::thread::spawn(move || {
                        let mine = vec![r.rank() as u8; r.rank() + round as usize];
                        r.all_gather(&mine)
                    })
                })
                .collect();
            for h in handles {
                let all = h.join().unwrap().unwrap();
                for (rank, bytes) in all.iter().enumerate() {
                    assert_eq!(bytes, &vec![rank as u8; rank + round as usize]);
                }
            }
        }
    }

    #[test]
    fn a_rank_that_never_joins_is_named() {
        let path = socket("missing");
        let err = LocalRendezvous::join(&path, 0, 3, Duration::from_millis(200)).unwrap_err();
        assert!(err.message.contains("rank(s) 1, 2 did not join"), "{err}");
        let err =
            LocalRendezvous::join(&socket("nobody"), 1, 2, Duration::from_millis(100)).unwrap_err();
        assert!(err.message.contains("rank 0 did not listen"), "{err}");
        assert!(LocalRendezvous::join(&path, 2, 2, Duration::from_millis(10)).is_err());
    }

    #[test]
    fn a_peer_that_exits_becomes_an_error_not_a_hang() {
        let mut ranks = group("exit", 2);
        let leaf = ranks.pop().unwrap();
        drop(leaf);
        let root = ranks.pop().unwrap();
        let err = root.all_gather(b"x").unwrap_err();
        assert!(err.message.contains("rank 1"), "{err}");
    }

    #[test]
    fn a_silent_peer_times_out() {
        let path = socket("silent");
        let p2 = path.clone();
        let leaf = std::thread::spawn(move || {
            LocalRendezvous::join(&p2, 1, 2, Duration::from_secs(5)).unwrap()
        });
        let root = LocalRendezvous::join(&path, 0, 2, Duration::from_millis(300)).unwrap();
        let _leaf = leaf.join().unwrap();
        let start = Instant::now();
        assert!(root.all_gather(b"x").is_err());
        assert!(start.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn a_group_of_one_needs_no_socket() {
        let alone = LocalRendezvous::join(&socket("alone"), 0, 1, Duration::ZERO).unwrap();
        assert_eq!(alone.all_gather(b"me").unwrap(), vec![b"me".to_vec()]);
    }
}
