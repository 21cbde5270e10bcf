//! [`Macvlans`]: the macvlan life cycle (create or reuse, configure, share between a
//! Service's clients, remove) over any [`MacvlanKernel`].

use super::{
    ARP_SETTINGS, ConfFamily, IPV6_SETTINGS, LINK_LOCAL_LIFETIME_SECS, LinkAction, MLD_SETTINGS,
    MacvlanError, MacvlanKernel, MacvlanSpec, NO_DAD, eui64_link_local, foreign_mac_owner,
    format_mac, link_action, stale, validate,
};

/// Macvlan management over a [`MacvlanKernel`].
#[derive(Debug)]
pub struct Macvlans<K> {
    kernel: K,
    /// Who uses each macvlan ([`Macvlans::acquire`]): a dual-stack Service's DHCPv4 and
    /// DHCPv6 clients share one.
    users:
        tokio::sync::Mutex<std::collections::HashMap<String, std::collections::BTreeSet<String>>>,
}

impl<K: MacvlanKernel> Macvlans<K> {
    /// Over `kernel`.
    pub fn new(kernel: K) -> Self {
        Self {
            kernel,
            users: tokio::sync::Mutex::default(),
        }
    }

    /// [`Self::ensure`] for `user` (e.g. `v4`, `v6`: the clients of one Service): the
    /// macvlan stays until every user has called [`Self::release`]. Calls for one name are
    /// serialised, so two users never create it twice.
    ///
    /// # Errors
    /// As [`Self::ensure`].
    pub async fn acquire(&self, spec: &MacvlanSpec, user: &str) -> Result<u32, MacvlanError> {
        let mut users = self.users.lock().await;
        let index = self.ensure(spec).await?;
        users
            .entry(spec.name.clone())
            .or_default()
            .insert(user.to_string());
        Ok(index)
    }

    /// `user` is done with macvlan `name`: removes it ([`Self::remove`]) when no other user
    /// remains; `Ok(false)` when it stays (or was absent).
    ///
    /// # Errors
    /// As [`Self::remove`].
    pub async fn release(&self, name: &str, user: &str) -> Result<bool, MacvlanError> {
        let mut users = self.users.lock().await;
        if let Some(set) = users.get_mut(name) {
            set.remove(user);
            if !set.is_empty() {
                return Ok(false);
            }
            users.remove(name);
        }
        self.remove(name).await
    }

    /// Puts the link-local address of `mac` ([`eui64_link_local`]) on macvlan `index`
    /// (`name`) for [`LINK_LOCAL_LIFETIME_SECS`], for a DHCPv6 client, which keeps it with
    /// [`Self::refresh_link_local`]; returns the address.
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`].
    pub async fn add_link_local(
        &self,
        index: u32,
        name: &str,
        mac: [u8; 6],
    ) -> Result<std::net::Ipv6Addr, MacvlanError> {
        let addr = eui64_link_local(mac);
        self.kernel
            .link_local(index, name, addr, LINK_LOCAL_LIFETIME_SECS, true)
            .await?;
        Ok(addr)
    }

    /// Renews the lifetimes of [`Self::add_link_local`]'s address; `Ok(false)` when it has
    /// expired (vipd did not run for [`LINK_LOCAL_LIFETIME_SECS`]): it is not added back,
    /// so a holder frozen past its fence never sends from it again unless the client is set
    /// up anew.
    ///
    /// # Errors
    /// [`MacvlanError::Netlink`].
    pub async fn refresh_link_local(
        &self,
        index: u32,
        name: &str,
        mac: [u8; 6],
    ) -> Result<bool, MacvlanError> {
        self.kernel
            .link_local(
                index,
                name,
                eui64_link_local(mac),
                LINK_LOCAL_LIFETIME_SECS,
                false,
            )
            .await
    }

    /// The kernel access.
    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    /// Makes `spec`'s macvlan exist, configured and up; returns its index. An existing vipd
    /// macvlan of that name is reused when identical, replaced otherwise. Order: create (down),
    /// ifalias, no kernel link-local ([`MacvlanKernel::no_link_local`]), sysctls (`rp_filter`, [`ARP_SETTINGS`], [`IPV6_SETTINGS`], [`MLD_SETTINGS`] best
    /// effort, [`NO_DAD`] when `ipv6_now`), up, so that it never answers with the kernel defaults.
    ///
    /// # Errors
    /// [`validate`]'s errors; [`MacvlanError::NoParent`]; [`MacvlanError::NotOurs`] (an
    /// interface of that name not created by vipd, left alone); kernel errors.
    pub async fn ensure(&self, spec: &MacvlanSpec) -> Result<u32, MacvlanError> {
        validate(spec)?;
        let links = self.kernel.links().await?;
        let parent_link = links
            .iter()
            .find(|l| l.name == spec.parent)
            .ok_or_else(|| MacvlanError::NoParent {
                name: spec.name.clone(),
                parent: spec.parent.clone(),
            })?;
        if parent_link.mac == [0; 6] {
            return Err(MacvlanError::NotEthernet {
                name: spec.name.clone(),
                parent: spec.parent.clone(),
            });
        }
        let parent = parent_link.index;
        let neighbours = self.kernel.neighbours(parent, &spec.parent).await?;
        if let Some(owner) = foreign_mac_owner(&links, &neighbours, spec) {
            return Err(MacvlanError::ForeignMac {
                name: spec.name.clone(),
                mac: format_mac(&spec.mac),
                owner,
            });
        }
        let planned = link_action(&links, spec, parent)?;
        // Asked once per macvlan this node creates: a macvlan already ours carries the MAC,
        // and its own frames would be the answer.
        if spec.probe_mac
            && !matches!(planned, LinkAction::Reuse(_))
            && let Some(owner) = self
                .kernel
                .mac_answers(parent, &spec.parent, parent_link.mac, spec.mac)
                .await?
        {
            return Err(MacvlanError::ForeignMac {
                name: spec.name.clone(),
                mac: format_mac(&spec.mac),
                owner,
            });
        }
        let index = match planned {
            LinkAction::Reuse(index) => index,
            LinkAction::Replace(index) => {
                self.kernel.delete(index, &spec.name).await?;
                self.kernel
                    .create(parent, &spec.name, spec.mac, &spec.mark)
                    .await?
            }
            LinkAction::Create => {
                self.kernel
                    .create(parent, &spec.name, spec.mac, &spec.mark)
                    .await?
            }
        };
        self.kernel.no_link_local(index, &spec.name).await?;
        self.configure(ConfFamily::Ipv4, &spec.name, "rp_filter", spec.rp_filter)?;
        for (key, value) in ARP_SETTINGS {
            self.configure(ConfFamily::Ipv4, &spec.name, key, value)?;
        }
        for (key, value) in IPV6_SETTINGS {
            match self.configure(ConfFamily::Ipv6, &spec.name, key, value) {
                Err(MacvlanError::Sysctl { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
        for (key, value) in MLD_SETTINGS {
            if let Err(e) = self.configure(ConfFamily::Ipv6, &spec.name, key, value) {
                tracing::debug!(macvlan = %spec.name, error = %e, "MLD report interval left at the kernel's default");
            }
        }
        if spec.ipv6_now {
            // DHCPv6 needs IPv6: no skipping when the kernel has none.
            self.configure(ConfFamily::Ipv6, &spec.name, NO_DAD.0, NO_DAD.1)?;
        }
        self.kernel.up(index, &spec.name).await?;
        Ok(index)
    }

    /// Writes one setting of macvlan `name`. Where `/proc/sys` is read-only (a container
    /// without privileges) a setting that already holds `value` (inherited from the host's
    /// `conf/default`) is fine; otherwise [`MacvlanError::ReadOnlySysctl`] says what to do.
    fn configure(
        &self,
        family: ConfFamily,
        name: &str,
        key: &'static str,
        value: u8,
    ) -> Result<(), MacvlanError> {
        match self.kernel.set_conf(family, name, key, value) {
            Err(MacvlanError::Sysctl { path, source, .. })
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                let current = self.kernel.get_conf(family, name, key);
                if current == Some(value) {
                    return Ok(());
                }
                Err(MacvlanError::ReadOnlySysctl {
                    name: name.into(),
                    path,
                    family: family.dir(),
                    key,
                    value,
                    current: current.map_or_else(|| "?".into(), |c| c.to_string()),
                })
            }
            other => other,
        }
    }

    /// Deletes the macvlan `name` if it is vipd's (marked); absent = `Ok(false)`.
    ///
    /// # Errors
    /// [`MacvlanError::NotOurs`] when `name` exists unmarked (left alone); kernel errors.
    pub async fn remove(&self, name: &str) -> Result<bool, MacvlanError> {
        let links = self.kernel.links().await?;
        match links.iter().find(|l| l.name == name) {
            None => Ok(false),
            Some(l) if l.is_ours() => {
                self.kernel.delete(l.index, name).await?;
                Ok(true)
            }
            Some(_) => Err(MacvlanError::NotOurs { name: name.into() }),
        }
    }

    /// Deletes every vipd macvlan not named in `keep` (at start: `keep` empty); returns the
    /// names deleted. Macvlans without vipd's mark are never touched.
    ///
    /// # Errors
    /// Kernel errors (the first one; the others are still tried).
    pub async fn remove_stale(&self, keep: &[&str]) -> Result<Vec<String>, MacvlanError> {
        let links = self.kernel.links().await?;
        let mut removed = Vec::new();
        let mut first_error = None;
        for link in stale(&links, keep) {
            match self.kernel.delete(link.index, &link.name).await {
                Ok(()) => removed.push(link.name.clone()),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }
}
