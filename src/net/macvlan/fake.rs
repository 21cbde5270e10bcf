//! A [`MacvlanKernel`] in memory, for unit tests: it records every call.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{ConfFamily, LinkEntry, MacvlanError, MacvlanKernel, Neighbour, format_mac};

#[derive(Default)]
pub(crate) struct FakeKernel {
    pub(crate) links: Mutex<Vec<LinkEntry>>,
    calls: Mutex<Vec<String>>,
    /// Answer IPv6 settings with `NotFound`, as a kernel without IPv6 does.
    pub(crate) no_ipv6: AtomicBool,
    /// `/proc/sys` read-only (a container without privileges): writes fail, and each
    /// setting reads as the value given for its key (unreadable when absent).
    pub(crate) read_only: Mutex<Option<std::collections::HashMap<&'static str, u8>>>,
    /// Links carrying their link-local address ([`MacvlanKernel::link_local`]).
    link_locals: Mutex<std::collections::BTreeSet<u32>>,
    /// The parent's neighbour table.
    pub(crate) neighbours: Mutex<Vec<Neighbour>>,
    /// MACs a host on the segment answers from ([`MacvlanKernel::mac_answers`]).
    pub(crate) answering: Mutex<Vec<[u8; 6]>>,
}

impl FakeKernel {
    pub(crate) fn with(links: Vec<LinkEntry>) -> Self {
        Self {
            links: Mutex::new(links),
            calls: Mutex::default(),
            no_ipv6: AtomicBool::new(false),
            read_only: Mutex::new(None),
            link_locals: Mutex::default(),
            neighbours: Mutex::default(),
            answering: Mutex::default(),
        }
    }
    pub(crate) fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
    fn log(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }
}

impl MacvlanKernel for FakeKernel {
    async fn links(&self) -> Result<Vec<LinkEntry>, MacvlanError> {
        Ok(self.links.lock().unwrap().clone())
    }
    async fn create(
        &self,
        parent_index: u32,
        name: &str,
        mac: [u8; 6],
        mark: &str,
    ) -> Result<u32, MacvlanError> {
        self.log(format!(
            "create {name} on {parent_index} {} {mark}",
            format_mac(&mac)
        ));
        let mut links = self.links.lock().unwrap();
        let index = links.iter().map(|l| l.index).max().unwrap_or(0) + 1;
        links.push(LinkEntry {
            index,
            name: name.into(),
            macvlan: true,
            alias: Some(mark.into()),
            parent: Some(parent_index),
            mac,
        });
        Ok(index)
    }
    async fn neighbours(
        &self,
        _parent_index: u32,
        _parent: &str,
    ) -> Result<Vec<Neighbour>, MacvlanError> {
        Ok(self.neighbours.lock().unwrap().clone())
    }
    async fn mac_answers(
        &self,
        _parent_index: u32,
        parent: &str,
        _parent_mac: [u8; 6],
        mac: [u8; 6],
    ) -> Result<Option<String>, MacvlanError> {
        self.log(format!("ask {parent} who uses {}", format_mac(&mac)));
        Ok(self
            .answering
            .lock()
            .unwrap()
            .contains(&mac)
            .then(|| format!("a host on {parent} that answers from it")))
    }
    async fn no_link_local(&self, _index: u32, name: &str) -> Result<bool, MacvlanError> {
        if self.no_ipv6.load(Ordering::Relaxed) {
            return Ok(false);
        }
        self.log(format!("addrgenmode none {name}"));
        Ok(true)
    }
    async fn up(&self, index: u32, name: &str) -> Result<(), MacvlanError> {
        self.log(format!("up {name} {index}"));
        Ok(())
    }
    async fn delete(&self, index: u32, name: &str) -> Result<(), MacvlanError> {
        self.log(format!("delete {name} {index}"));
        self.links.lock().unwrap().retain(|l| l.index != index);
        self.link_locals.lock().unwrap().remove(&index);
        Ok(())
    }
    fn set_conf(
        &self,
        family: ConfFamily,
        name: &str,
        key: &'static str,
        value: u8,
    ) -> Result<(), MacvlanError> {
        if family == ConfFamily::Ipv6 && self.no_ipv6.load(Ordering::Relaxed) {
            return Err(MacvlanError::Sysctl {
                name: name.into(),
                path: format!("/proc/sys/net/ipv6/conf/{name}/{key}"),
                value,
                source: std::io::ErrorKind::NotFound.into(),
            });
        }
        if self.read_only.lock().unwrap().is_some() {
            return Err(MacvlanError::Sysctl {
                name: name.into(),
                path: format!("/proc/sys/net/{}/conf/{name}/{key}", family.dir()),
                value,
                source: std::io::ErrorKind::ReadOnlyFilesystem.into(),
            });
        }
        self.log(format!("sysctl {} {name} {key}={value}", family.dir()));
        Ok(())
    }
    fn get_conf(&self, _family: ConfFamily, _name: &str, key: &'static str) -> Option<u8> {
        self.read_only.lock().unwrap().as_ref()?.get(key).copied()
    }
    async fn link_local(
        &self,
        index: u32,
        name: &str,
        addr: std::net::Ipv6Addr,
        lifetime_secs: u32,
        create: bool,
    ) -> Result<bool, MacvlanError> {
        let mut present = self.link_locals.lock().unwrap();
        if !create && !present.contains(&index) {
            self.log(format!("link-local {name} {addr} absent"));
            return Ok(false);
        }
        present.insert(index);
        let verb = if create { "add" } else { "refresh" };
        self.log(format!("link-local {verb} {name} {addr} {lifetime_secs}s"));
        Ok(true)
    }
}

impl FakeKernel {
    /// The link-local address of link `index` expires (vipd did not refresh it in time).
    pub(crate) fn expire_link_local(&self, index: u32) {
        self.link_locals.lock().unwrap().remove(&index);
    }
}
