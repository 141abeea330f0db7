//! CHECK of every recorded network of an attachment (0.4.0+), and STATUS
//! of a network (1.1.0+).

use serde_json::{Map, Value};

use super::chain::{convert_for, recorded_list, stdin_for};
use super::fault::Step;
use super::lock::{Loaded, Multus, Take};
use super::{Engine, Error, ErrorKind};
use crate::api::{code, Command};
use crate::cni::exec::CallEnv;
use crate::cni::state::{Attachment, Delegate, State};
use crate::netconf::{at_least, Invocation, NetworkList};

impl Engine {
    /// CHECK: verifies every recorded network of the attachment with the
    /// recorded result, in order; the first failure is returned.
    pub async fn check(&self, inv: &Invocation) -> Result<(), Error> {
        let take = Take::call(Command::Check, &inv.netns);
        self.locked(&inv.container_id, take, |loaded| {
            self.check_locked(inv, loaded)
        })
        .await
    }

    async fn check_locked(&self, inv: &Invocation, loaded: Loaded) -> Result<(), Error> {
        let record = loaded.record;
        let Some(att) = record.as_ref().and_then(|r| r.attachment(&inv.ifname)) else {
            if let Multus::Delegates(delegates) = self.load_multus(&inv.container_id).await? {
                return self.check_multus(inv, &delegates).await;
            }
            return Err(Error::new(
                ErrorKind::Failed,
                code::UNKNOWN_CONTAINER,
                format!(
                    "container {:?} has no attachment on {:?}",
                    inv.container_id, inv.ifname
                ),
            ));
        };
        for d in &att.delegates {
            self.check_recorded(inv, att, d).await?;
        }
        Ok(())
    }

    /// CHECK of network `d` of attachment `att` with its recorded config
    /// and result; refused when its ADD did not complete.
    pub(super) async fn check_recorded(
        &self,
        inv: &Invocation,
        att: &Attachment,
        d: &Delegate,
    ) -> Result<(), Error> {
        if d.state != State::Added {
            return Err(Error::new(
                ErrorKind::Failed,
                code::UNKNOWN_CONTAINER,
                format!("network {:?}: its ADD did not complete", d.name),
            ));
        }
        let list = recorded_list(d).map_err(Error::config)?;
        let env = self.call_env(
            Command::Check,
            inv,
            &d.ifname,
            &inv.netns,
            d.cni_args.as_deref(),
        );
        self.check_network(&list, &env, d.result.as_ref(), d.capability_args_in(att))
            .await
    }

    /// CHECK of one network: every plugin at 0.4.0 or later, with `result`
    /// as prevResult; nothing when the list disables CHECK.
    pub(super) async fn check_network(
        &self,
        list: &NetworkList,
        env: &CallEnv,
        result: Option<&Value>,
        cap_args: &Map<String, Value>,
    ) -> Result<(), Error> {
        let version = list.version().unwrap_or_default();
        if !at_least(&version, "0.4.0") {
            return Err(Error::new(
                ErrorKind::Invalid,
                code::INCOMPATIBLE_VERSION,
                format!(
                    "network {:?}: configuration version {version:?} does not support the CHECK command",
                    list.name
                ),
            ));
        }
        if list.disable_check {
            return Ok(());
        }
        self.fault(Step::CheckNetwork)?;
        let located = self.prepare(list, Command::Check).await?;
        for (i, (plugin, version)) in located.plugins.iter().enumerate() {
            if !at_least(version, "0.4.0") {
                continue;
            }
            let prev = result.and_then(|r| convert_for(r, version));
            let stdin = stdin_for(list, i, version, Command::Check, prev, cap_args);
            self.runner
                .run(plugin, env, stdin)
                .await
                .map_err(|e| Error::plugin(Command::Check, &list.name, e))?;
        }
        Ok(())
    }

    /// STATUS: asks each plugin of `list` that speaks 1.1.0 whether it can
    /// serve ADDs; the first failure is returned. Lists older than 1.1.0
    /// succeed without running anything (libcni).
    pub async fn status(&self, list: &NetworkList) -> Result<(), Error> {
        if !list.version().is_some_and(|v| at_least(&v, "1.1.0")) {
            return Ok(());
        }
        let located = self.prepare(list, Command::Status).await?;
        let env = CallEnv {
            command: Command::Status.as_str(),
            ..CallEnv::default()
        };
        for (i, (plugin, version)) in located.plugins.iter().enumerate() {
            if !at_least(version, "1.1.0") {
                continue;
            }
            let stdin = stdin_for(list, i, version, Command::Status, None, &Map::new());
            self.runner
                .run(plugin, &env, stdin)
                .await
                .map_err(|e| Error::plugin(Command::Status, &list.name, e))?;
        }
        Ok(())
    }
}
