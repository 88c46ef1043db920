//! What the session uses, charged to its VM, and the VM's scheduling decision.
//!
//! Every backend charges what a guest allocates on the device here before (or, where
//! only the host can tell the size, right after) the allocation, and uncharges it when
//! the host frees it. The quota and the VM's total live in the VM's page, shared with
//! the daemon (which sets the quota, live) and with the VM's other API servers, so
//! one quota covers all of a VM's sessions without a message. The session's own
//! share is kept in its usage page, so the daemon can give back what a session that
//! died still held.
//!
//! The same way, backends report the device time of finished commands and how many
//! are in flight or held, and read the VM's scheduling decision (run, hold, delay),
//! which the daemon's scheduler writes into the VM's page.

use std::sync::Arc;

use hira_protocol::usage::{Gate, OverQuota, UsagePage, VmPage};

/// The session's view of its VM's page and its own usage page.
#[derive(Debug, Default)]
pub struct Account {
    vm: Option<VmPage>,
    session: Option<Arc<UsagePage>>,
    /// Serialises updates of the running commands (several host threads complete
    /// commands).
    running: std::sync::Mutex<()>,
}

impl Account {
    /// No VM page (an API server started by hand): nothing is limited.
    pub fn unlimited() -> Self {
        Self::default()
    }

    pub fn new(vm: Option<VmPage>, session: Option<Arc<UsagePage>>) -> Self {
        Account {
            vm,
            session,
            running: std::sync::Mutex::new(()),
        }
    }

    /// A command started running at `start` (`1`) or one that did stopped (`-1`).
    pub fn running(&self, start: u64, delta: i64) {
        if let Some(s) = &self.session {
            let _g = self.running.lock().unwrap_or_else(|e| e.into_inner());
            s.running(start, delta);
        }
    }

    /// Charges `bytes` if the VM stays within its quota.
    pub fn charge(&self, bytes: u64) -> Result<(), OverQuota> {
        if let Some(vm) = &self.vm {
            vm.charge(bytes)?;
        }
        if let Some(s) = &self.session {
            s.memory(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        Ok(())
    }

    /// Gives back `bytes` charged earlier.
    pub fn uncharge(&self, bytes: u64) {
        if let Some(vm) = &self.vm {
            vm.uncharge(bytes);
        }
        if let Some(s) = &self.session {
            s.memory(-i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// The VM's scheduling decision now (`Run` without a VM page).
    pub fn gate(&self) -> Gate {
        self.vm.as_ref().map_or(Gate::Run, VmPage::gate)
    }

    /// Adds a finished command's device time.
    pub fn device_time(&self, ns: u64) {
        if let Some(s) = &self.session {
            s.device_time(ns);
        }
    }

    /// A measured command was enqueued (`1`) or finished (`-1`).
    pub fn in_flight(&self, delta: i64) {
        if let Some(s) = &self.session {
            s.in_flight(delta);
        }
    }

    /// A command was held back (`1`) or let through (`-1`).
    pub fn held(&self, delta: i64) {
        if let Some(s) = &self.session {
            s.held(delta);
        }
    }

    /// A held command was let through after `ns` ns.
    pub fn held_for(&self, ns: u64) {
        if let Some(s) = &self.session {
            s.held_for(ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_reach_the_vm_and_the_session_page() {
        let (daemon_vm, fd) = VmPage::create().unwrap();
        let (daemon_usage, ufd) = UsagePage::create().unwrap();
        let q = Account::new(
            Some(VmPage::map(&fd).unwrap()),
            Some(Arc::new(UsagePage::map(&ufd).unwrap())),
        );
        daemon_vm.set_quota(Some(1000));
        q.charge(600).unwrap();
        assert!(q.charge(600).is_err());
        assert_eq!(daemon_usage.read().memory, 600, "a refusal charges nothing");
        q.uncharge(600);
        assert_eq!((daemon_vm.used(), daemon_usage.read().memory), (0, 0));
        assert!(Account::unlimited().charge(u64::MAX).is_ok());
    }
}
