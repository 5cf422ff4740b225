//! Background work at the lowest CPU priority: reads of the whole IPVS table that nothing
//! waits for (a full resync's, a scrape's) run on threads that leave the CPUs to the syncs,
//! so a change that lands during such a read is not slowed by it.

use std::future::Future;

use tokio::sync::oneshot;

/// The lowest CPU priority (nice 19): a thread at it gets about 1.5 % of a CPU that a
/// thread at the default priority also wants.
pub const LOWEST_NICE: i32 = 19;

/// Puts the calling thread at nice value `nice` (0, the default, to [`LOWEST_NICE`]). Any
/// thread may lower its own priority (no capability needed), and the threads it starts
/// afterwards inherit it; raising it again would need `CAP_SYS_NICE`, so only threads of
/// their own should call this.
#[allow(unsafe_code)]
pub fn lower_thread_priority(nice: i32) -> std::io::Result<()> {
    // SAFETY: setpriority(2) with PRIO_PROCESS and who = 0 changes the calling thread only
    // (nice values are per thread on Linux); it reads and writes no memory of ours. nix
    // wraps no setpriority, so the one system call needs `unsafe`.
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Runs `future` on a new thread named `name`, at nice value `nice`
/// ([`lower_thread_priority`]; on failure, logged, at the caller's), on a current-thread
/// runtime of its own: the blocking threads that runtime starts, and the processes they
/// spawn, inherit the priority. The answer comes through the receiver; dropping the
/// receiver cancels the future. Fails when the thread or its runtime cannot be started.
pub fn spawn_in_background<F>(
    name: &str,
    nice: i32,
    future: F,
) -> std::io::Result<oneshot::Receiver<F::Output>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut answer, receiver) = oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            if let Err(error) = lower_thread_priority(nice) {
                tracing::warn!(%error, "cannot lower a background thread's CPU priority");
            }
            runtime.block_on(async move {
                tokio::select! {
                    output = future => {
                        let _ = answer.send(output);
                    }
                    () = answer.closed() => {}
                }
            });
        })?;
    Ok(receiver)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn nice_of_this_thread() -> i32 {
        // Per thread on Linux: /proc/thread-self/stat's 19th field.
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(16).unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn background_work_runs_at_its_priority_and_its_blocking_threads_too() {
        let before = nice_of_this_thread();
        let answer = spawn_in_background("background-test", 10, async {
            let own = nice_of_this_thread();
            let blocking = tokio::task::spawn_blocking(nice_of_this_thread)
                .await
                .unwrap();
            (own, blocking)
        })
        .unwrap();
        assert_eq!(answer.await.unwrap(), (10, 10));
        assert_eq!(
            nice_of_this_thread(),
            before,
            "the caller's priority changed"
        );
    }

    #[tokio::test]
    async fn dropping_the_receiver_cancels_the_work() {
        struct Dropped(Option<std::sync::mpsc::Sender<()>>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                if let Some(tx) = self.0.take() {
                    let _ = tx.send(());
                }
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let guard = Dropped(Some(tx));
        let answer = spawn_in_background("background-test", LOWEST_NICE, async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        })
        .unwrap();
        drop(answer);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the background future was not dropped");
    }
}
