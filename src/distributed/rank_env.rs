//! [`RankEnv`]: a process's rank, read as `torchrun` passes it.

use crate::error::{Error, Result};

/// Where this process sits among the ranks: `RANK`, `WORLD_SIZE` and `LOCAL_RANK` (the rank on
/// this machine, which picks its GPU), and the rendezvous `MASTER_ADDR`:`MASTER_PORT`, the
/// variables `torchrun` sets. Read only when asked ([`from_env`](Self::from_env)): the library
/// reads no environment by itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// The rank on this machine (`rank` where `LOCAL_RANK` is not set).
    pub local_rank: usize,
    /// Rank 0's address, `host:port` (`127.0.0.1:29500` where `MASTER_ADDR` and `MASTER_PORT`
    /// are not set, as `torchrun`'s default).
    pub master: String,
}

impl RankEnv {
    /// From this process's environment.
    ///
    /// # Errors
    /// [`Error::InvalidEnvironment`] for a missing `RANK` or `WORLD_SIZE`, a value that is not a
    /// number, or a rank outside the world.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// From the variables `var` gives (for tests, and for launchers that pass them otherwise).
    ///
    /// ```
    /// use boundscope::distributed::RankEnv;
    /// let vars = |name: &str| match name {
    ///     "RANK" => Some("1".to_string()),
    ///     "WORLD_SIZE" => Some("2".to_string()),
    ///     _ => None,
    /// };
    /// let env = RankEnv::from_vars(vars).unwrap();
    /// assert_eq!((env.rank, env.world_size, env.local_rank), (1, 2, 1));
    /// assert_eq!(env.master, "127.0.0.1:29500");
    /// let six = |name: &str| match name {
    ///     "RANK" => Some("0".to_string()),
    ///     "WORLD_SIZE" => Some("1".to_string()),
    ///     "MASTER_ADDR" => Some("::1".to_string()),
    ///     "MASTER_PORT" => Some("7000".to_string()),
    ///     _ => None,
    /// };
    /// assert_eq!(RankEnv::from_vars(six).unwrap().master, "[::1]:7000");
    /// let err = RankEnv::from_vars(|name| (name == "RANK").then(|| "0".to_string())).unwrap_err();
    /// assert!(err.to_string().contains("WORLD_SIZE"));
    /// ```
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let number = |name: &str, expected: &str, required: bool| -> Result<Option<usize>> {
            match var(name) {
                None if required => Err(Error::InvalidEnvironment {
                    variable: name.into(),
                    value: String::new(),
                    expected: format!(
                        "{expected} (it is not set: start the ranks with a launcher that sets it, as torchrun does)"
                    ),
                }),
                None => Ok(None),
                Some(value) => value.trim().parse::<usize>().map(Some).map_err(|_| Error::InvalidEnvironment {
                    variable: name.into(),
                    value,
                    expected: expected.into(),
                }),
            }
        };
        let world_size = number("WORLD_SIZE", "the number of ranks, at least 1", true)?.unwrap_or(1);
        if super::in_process::world_size_refused(world_size).is_some() {
            return Err(Error::InvalidEnvironment {
                variable: "WORLD_SIZE".into(),
                value: world_size.to_string(),
                expected: format!("the number of ranks, 1 to {}", super::MAX_WORLD_SIZE),
            });
        }
        let rank = number("RANK", "this process's rank, from 0 to WORLD_SIZE - 1", true)?.unwrap_or(0);
        if rank >= world_size {
            return Err(Error::InvalidEnvironment {
                variable: "RANK".into(),
                value: rank.to_string(),
                expected: format!("a rank from 0 to {} (WORLD_SIZE is {world_size})", world_size.saturating_sub(1)),
            });
        }
        let local_rank = number("LOCAL_RANK", "the rank on this machine", false)?.unwrap_or(rank);
        let host = var("MASTER_ADDR").map_or_else(|| "127.0.0.1".to_string(), |h| h.trim().to_string());
        if host.is_empty() {
            return Err(Error::InvalidEnvironment {
                variable: "MASTER_ADDR".into(),
                value: String::new(),
                expected: "rank 0's host name or address".into(),
            });
        }
        let port = match var("MASTER_PORT") {
            None => 29500,
            // Port 0 would have rank 0 listen on a port the system picks, which the other ranks
            // cannot know.
            Some(value) => {
                value.trim().parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| Error::InvalidEnvironment {
                    variable: "MASTER_PORT".into(),
                    value,
                    expected: "rank 0's port, 1 to 65535".into(),
                })?
            }
        };
        // An IPv6 address takes brackets before its port.
        let master = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(Self { rank, world_size, local_rank, master })
    }
}
