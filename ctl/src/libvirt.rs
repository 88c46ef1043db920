//! `hira-ctl libvirt-hook`: libvirt's QEMU hook (`/etc/libvirt/hooks/qemu` runs it
//! with the domain's name, the operation, a sub-operation and an extra argument, and
//! the domain's XML on standard input).
//!
//! A domain that uses Hira says so in its metadata:
//!
//! ```xml
//! <metadata>
//!   <hira:vm xmlns:hira="https://hira.dev/xmlns/libvirt/1"
//!            spec="socket=/run/hira/vm7.vhost,cid=7,window=/dev/shm/hira-vm7,window-mb=64,share=3"/>
//! </metadata>
//! ```
//!
//! `spec` holds the keys `--vm` takes after `name=`; optional attributes are `name`
//! (the VM's name in Hira, default the domain's) and `control` (the daemon's control
//! socket, default as for `hira-ctl`). When the domain is prepared (before QEMU
//! starts) the VM is added (`vm_add`): a refusal fails the domain's start with the
//! daemon's reason. When it is released (QEMU gone) the VM is removed (`vm_remove`),
//! its sessions ended. Domains without the element, and other operations, are left
//! alone. The domain's devices must name the same socket and window
//! (`deploy/libvirt/domain.xml`).

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use hira_control::{Client, ControlError, Request, VmAddedAnswer, VmRemovedAnswer};

/// The namespace of Hira's element in a domain's metadata.
pub const NAMESPACE: &str = "https://hira.dev/xmlns/libvirt/1";

/// What a domain's metadata asks of Hira.
#[derive(Debug, PartialEq, Eq)]
pub struct DomainVm {
    pub name: String,
    pub spec: String,
    pub control: Option<PathBuf>,
}

/// Hira's element of `xml` (a domain), if it has one.
pub fn domain_vm(domain: &str, xml: &str) -> anyhow::Result<Option<DomainVm>> {
    let doc = roxmltree::Document::parse(xml).context("the domain's XML does not parse")?;
    let Some(el) = doc
        .descendants()
        .find(|n| n.is_element() && n.tag_name().namespace() == Some(NAMESPACE))
    else {
        return Ok(None);
    };
    if el.tag_name().name() != "vm" {
        bail!(
            "Hira's metadata element is <vm>, not <{}>",
            el.tag_name().name()
        );
    }
    let spec = el
        .attribute("spec")
        .context("Hira's <vm> element needs a spec attribute")?;
    if spec.split(',').any(|kv| kv.starts_with("name=")) {
        bail!("give the VM's name in the name attribute, not in spec");
    }
    Ok(Some(DomainVm {
        name: el.attribute("name").unwrap_or(domain).to_string(),
        spec: spec.to_string(),
        control: el.attribute("control").map(PathBuf::from),
    }))
}

/// Runs the hook: `args` are what libvirt passed, `socket` the control socket when
/// the domain names none.
pub fn hook(args: &[String], socket: PathBuf) -> anyhow::Result<()> {
    let (Some(domain), Some(op)) = (args.first(), args.get(1)) else {
        bail!("libvirt runs this hook with the domain's name and the operation");
    };
    if op != "prepare" && op != "release" {
        return Ok(());
    }
    let mut xml = String::new();
    std::io::stdin()
        .read_to_string(&mut xml)
        .context("cannot read the domain's XML")?;
    let Some(vm) = domain_vm(domain, &xml)? else {
        return Ok(());
    };
    let socket = vm.control.clone().unwrap_or(socket);
    let mut c = Client::connect(&socket)?;
    if op == "prepare" {
        let VmAddedAnswer { added } = c
            .ask(&Request::VmAdd {
                spec: format!("name={},{}", vm.name, vm.spec),
            })
            .with_context(|| format!("Hira cannot serve domain {domain:?}"))?;
        eprintln!("hira: VM {} served for domain {domain:?}", added.name);
        return Ok(());
    }
    // Released: also after a start that failed, when the VM may not have been added.
    let removed: Result<VmRemovedAnswer, ControlError> = c.ask(&Request::VmRemove {
        vm: vm.name.clone(),
        timeout_ms: Some(Duration::from_secs(30).as_millis() as u64),
    });
    match removed {
        Ok(r) => eprintln!(
            "hira: VM {} removed ({} sessions ended)",
            r.removed, r.sessions_ended
        ),
        Err(ControlError::Refused(e)) if e.contains("no VM") => {}
        Err(e) => return Err(e).context(format!("Hira cannot remove domain {domain:?}")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_domain_names_its_vm_in_its_metadata_or_is_left_alone() {
        let with = |meta: &str| {
            format!(
                "<domain type='qemu'><name>d</name><metadata>{meta}</metadata><devices/></domain>"
            )
        };
        let xml = with(&format!(
            "<hira:vm xmlns:hira='{NAMESPACE}' spec='hybrid=/x,cid=5' control='/c.sock'/>"
        ));
        assert_eq!(
            domain_vm("d", &xml).unwrap(),
            Some(DomainVm {
                name: "d".into(),
                spec: "hybrid=/x,cid=5".into(),
                control: Some("/c.sock".into()),
            })
        );
        let named = with(&format!(
            "<h:vm xmlns:h='{NAMESPACE}' name='vm9' spec='hybrid=/x,cid=5'/>"
        ));
        assert_eq!(domain_vm("d", &named).unwrap().unwrap().name, "vm9");
        assert_eq!(
            domain_vm("d", &with("<other xmlns='urn:x'/>")).unwrap(),
            None
        );
        for bad in [
            format!("<hira:vm xmlns:hira='{NAMESPACE}'/>"),
            format!("<hira:vm xmlns:hira='{NAMESPACE}' spec='name=x,hybrid=/x,cid=5'/>"),
            format!("<hira:host xmlns:hira='{NAMESPACE}' spec='hybrid=/x,cid=5'/>"),
        ] {
            assert!(domain_vm("d", &with(&bad)).is_err(), "{bad}");
        }
        assert!(domain_vm("d", "<domain").is_err());
    }
}
