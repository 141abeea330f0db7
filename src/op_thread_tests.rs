use super::*;
use std::thread::ThreadId;
use std::time::Duration;

fn here() -> ThreadId {
    std::thread::current().id()
}

#[tokio::test(flavor = "current_thread")]
async fn blocking_work_should_run_in_place_on_a_calls_thread_and_on_the_pool_elsewhere() {
    let runtime = here();
    let ops = OpThreads::new(2);
    let (call, work, flagged) = ops
        .run(async {
            let call = here();
            let work = off_runtime(here).await.unwrap();
            (call, work, on_op_thread())
        })
        .await;
    assert_ne!(call, runtime, "the call ran on the runtime's thread");
    assert_eq!(work, call, "the blocking work left the call's thread");
    assert!(flagged);
    // On the runtime: the pool, as before; the flag does not stay on a
    // pool thread that ran a call.
    assert!(!on_op_thread());
    for _ in 0..4 {
        let (work, flagged) = off_runtime(|| (here(), on_op_thread())).await.unwrap();
        assert_ne!(work, runtime);
        assert!(!flagged, "a pool thread kept the call's flag");
    }
    // A panic in place is an error, as from the pool.
    let e = ops
        .run(async { off_runtime(|| panic!("in place")).await })
        .await
        .unwrap_err();
    assert!(e.contains("panicked"), "{e}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_calls_timers_and_tasks_should_be_the_runtimes() {
    let runtime = here();
    let ops = OpThreads::new(1);
    let (task, slept) = ops
        .run(async {
            let start = std::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(5)).await;
            // A task the call spawns runs on the runtime, after the call too.
            let task = tokio::spawn(async { here() });
            (task, start.elapsed())
        })
        .await;
    assert!(slept >= Duration::from_millis(5));
    assert_eq!(task.await.unwrap(), runtime);
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_past_the_bound_should_run_on_the_runtime() {
    let runtime = here();
    let ops = OpThreads::new(1);
    let (release, held) = tokio::sync::oneshot::channel::<()>();
    let (started_tx, started) = tokio::sync::oneshot::channel::<ThreadId>();
    let first = tokio::spawn({
        let ops = ops.clone();
        async move {
            ops.run(async move {
                let _ = started_tx.send(here());
                let _ = held.await;
                here()
            })
            .await
        }
    });
    let first_thread = started.await.unwrap();
    assert_ne!(first_thread, runtime);
    // The one thread is taken: the next call runs here, and finishes while
    // the first still waits.
    let second = ops.run(async { here() }).await;
    assert_eq!(second, runtime);
    release.send(()).unwrap();
    assert_eq!(first.await.unwrap(), first_thread);
    // Its thread given back, the next call gets one again.
    assert_ne!(ops.run(async { here() }).await, runtime);
}

#[tokio::test(flavor = "current_thread")]
async fn a_panic_in_a_call_should_resume_in_its_caller_and_give_its_thread_back() {
    let ops = OpThreads::new(1);
    let caller = tokio::spawn({
        let ops = ops.clone();
        async move { ops.run(async { panic!("the call") }).await }
    });
    let e = caller.await.unwrap_err();
    assert!(e.is_panic());
    assert_ne!(ops.run(async { here() }).await, here());
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_should_be_held_by_pointer_not_copied_into_its_waiters() {
    // A CNI call's future runs to tens of kilobytes; held inline, every
    // future awaiting `run` and the task running them would carry (and
    // copy) all of it.
    let ops = OpThreads::new(1);
    let state = [7u8; 64 * 1024];
    let call = async move {
        tokio::task::yield_now().await;
        state.iter().map(|b| u64::from(*b)).sum::<u64>()
    };
    assert!(std::mem::size_of_val(&call) >= 64 * 1024);
    let running = ops.run(call);
    let size = std::mem::size_of_val(&running);
    assert!(size < 2048, "run() holds {size} bytes");
    assert_eq!(running.await, 7 * 64 * 1024);
}
