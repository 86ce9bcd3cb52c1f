//! Starting ranks as `torchrun` does: `world` processes of the running program on this
//! machine, one per GPU, with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and
//! `MASTER_PORT` set (a free port on the loopback), `NCCL_NVLS_ENABLE=0`, and the program's
//! own arguments. Shared by `examples/ranks.rs` and `examples/gpt2.rs`.

use std::process::Command;
use std::time::Duration;

/// Starts `world` ranks of this program and waits for them; when one fails, stops the others
/// (they would wait for it until their timeout) and says which failed.
pub fn launch(world: usize) -> Result<(), String> {
    if world == 0 {
        return Err("a run needs at least one rank".into());
    }
    // A free port on the loopback for rank 0 (released before rank 0 binds it: another process
    // may take it in between, and then rank 0 says so; run again).
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
    let program = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = Vec::with_capacity(world);
    for rank in 0..world {
        let child = Command::new(&program)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("NCCL_NVLS_ENABLE", "0")
            .args(std::env::args().skip(1))
            .spawn();
        match child {
            Ok(child) => children.push(child),
            Err(e) => {
                // The ranks started would wait for this one until their timeout.
                for mut started in children {
                    let _ = started.kill();
                    let _ = started.wait();
                }
                return Err(format!("starting rank {rank}: {e}"));
            }
        }
    }
    // Wait for all; when one fails, stop the others (they would wait for it until their
    // timeout).
    let mut children: Vec<Option<std::process::Child>> = children.into_iter().map(Some).collect();
    let mut failed = Vec::new();
    while children.iter().any(Option::is_some) && failed.is_empty() {
        for (rank, slot) in children.iter_mut().enumerate() {
            if let Some(status) = slot.as_mut().map(|c| c.try_wait()).transpose().map_err(|e| e.to_string())?.flatten()
            {
                if !status.success() {
                    failed.push(rank);
                }
                *slot = None;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for child in children.iter_mut().flatten() {
        let _ = child.kill();
        let _ = child.wait();
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("ranks {failed:?} failed"))
    }
}
