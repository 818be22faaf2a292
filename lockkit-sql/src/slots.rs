//! A semaphore as permit slots (advisory keys, `GET_LOCK` names, lease
//! rows): the order in which a request tries them.

/// The order in which a semaphore's permit slots are tried: each once
/// without waiting, from a random one so that clients spread over the slots;
/// then, in session modes and if the caller waits, one bounded wait in the
/// server's queue of the first (`ServerWait::slice`). No slot granted: the
/// engine asks again while the caller's wait lasts.
pub(crate) struct SlotPlan {
    start: usize,
    len: usize,
}

impl SlotPlan {
    /// A plan over `len` slots (at least one).
    pub(crate) fn new(len: usize) -> Self {
        SlotPlan {
            start: fastrand::usize(..len.max(1)),
            len,
        }
    }

    /// The slots to try without waiting, in order.
    pub(crate) fn order(&self) -> impl Iterator<Item = usize> + use<> {
        let (start, len) = (self.start, self.len);
        (0..len).map(move |step| (start + step) % len)
    }

    /// The slot to wait on (in the server's queue, for session modes) once
    /// every slot was tried.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn first(&self) -> usize {
        self.start
    }
}
