//! Hira under a real libvirtd (Debian's `libvirt-daemon-system`, QEMU under TCG): the
//! QEMU hook (`hira-ctl libvirt-hook`, `deploy/libvirt/qemu`) adds each domain's VM
//! when the domain is prepared and removes it when it is released; the domain's XML
//! is the documented one (`deploy/libvirt/domain.xml`), booting a test image.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{Daemon, bin_dir, ensure_built};

const HOOK: &str = "/etc/libvirt/hooks/qemu";

/// One test at a time owns libvirtd and its hook.
static LIBVIRTD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether this machine can run these tests, with the reason when not.
fn assert_can_run() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let have = Command::new("virsh").arg("--version").output().is_ok()
        && Path::new("/usr/sbin/libvirtd").exists();
    assert!(
        root && have,
        "needs root and libvirt (scripts/test installs libvirt-daemon-system and libvirt-daemon-driver-qemu)"
    );
}

fn virsh(args: &[&str]) -> std::process::Output {
    Command::new("virsh")
        .arg("-c")
        .arg("qemu:///system")
        .args(args)
        .output()
        .expect("virsh runs")
}

fn virsh_ok(args: &[&str]) -> String {
    let o = virsh(args);
    assert!(
        o.status.success(),
        "virsh {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Waits until `done` holds, asking again on each change of what it reads; panics
/// with `what` after `limit`.
fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        // Polling a state libvirt offers no event for (domain states, hook effects).
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether a process named `name` runs.
fn running(name: &str) -> bool {
    Command::new("pgrep")
        .args(["-x", name])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// libvirtd (and virtlogd) started afresh, so that they find the hook.
fn restart_libvirtd() {
    let _ = Command::new("pkill").args(["-x", "libvirtd"]).status();
    wait_for("the old libvirtd to exit", Duration::from_secs(30), || {
        !running("libvirtd")
    });
    if !running("virtlogd") {
        assert!(
            Command::new("virtlogd")
                .arg("-d")
                .status()
                .unwrap()
                .success()
        );
    }
    assert!(
        Command::new("libvirtd")
            .arg("-d")
            .status()
            .unwrap()
            .success()
    );
    wait_for("libvirtd to answer", Duration::from_secs(60), || {
        virsh(&["version"]).status.success()
    });
}

/// The hook for this test's build; removed (and libvirtd restarted without it) when
/// dropped.
struct Hook;

impl Hook {
    fn install() -> Hook {
        std::fs::create_dir_all("/etc/libvirt/hooks").unwrap();
        let ours = std::fs::read_to_string(crate::support::workspace().join("deploy/libvirt/qemu"))
            .unwrap();
        assert!(ours.contains("libvirt-hook"), "{ours}");
        // The packaged hook, told where this build's hira-ctl is.
        let script = ours.replace(
            "exec \"${HIRA_CTL:-/usr/bin/hira-ctl}\"",
            &format!(
                "HIRA_CTL={}\nexec \"$HIRA_CTL\"",
                bin_dir().join("hira-ctl").display()
            ),
        );
        std::fs::write(HOOK, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(HOOK, std::fs::Permissions::from_mode(0o755)).unwrap();
        restart_libvirtd();
        Hook
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(HOOK);
        restart_libvirtd();
    }
}

/// A domain as `deploy/libvirt/domain.xml` has it, booting `image` by its kernel,
/// its serial console into `console`.
struct Domain {
    name: String,
    console: PathBuf,
    window: PathBuf,
}

impl Domain {
    fn define(d: &Daemon, name: &str, vm: &str, cid: u32, share: u32, image: &Path) -> Domain {
        let shm = format!("hira-e2e-{}-{vm}", std::process::id());
        let window = PathBuf::from("/dev/shm").join(&shm);
        let socket = d.dir.path().join(format!("{vm}.vhost"));
        let console = d.dir.path().join(format!("{vm}.console"));
        let spec = format!(
            "socket={},cid={cid},window={},window-mb=64,share={share}",
            socket.display(),
            window.display()
        );
        let xml = format!(
            r#"<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <metadata>
    <hira:vm xmlns:hira='https://hira.dev/xmlns/libvirt/1' name='{vm}' spec='{spec}' control='{control}'/>
  </metadata>
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{image}/vmlinuz</kernel>
    <initrd>{image}/initramfs.cpio.gz</initrd>
    <cmdline>console=ttyS0 quiet panic=-1</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
    <shmem name='{shm}'><model type='ivshmem-plain'/><size unit='M'>64</size></shmem>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-chardev'/>
    <qemu:arg value='socket,id=hira0,path={socket}'/>
    <qemu:arg value='-device'/>
    <qemu:arg value='vhost-user-vsock-pci,chardev=hira0,addr=0x10'/>
  </qemu:commandline>
</domain>
"#,
            control = d.dir.path().join("control.sock").display(),
            image = image.display(),
            console = console.display(),
            socket = socket.display(),
        );
        let file = d.dir.path().join(format!("{name}.xml"));
        std::fs::write(&file, xml).unwrap();
        let _ = virsh(&["destroy", name]);
        let _ = virsh(&["undefine", name]);
        virsh_ok(&["define", file.to_str().unwrap()]);
        Domain {
            name: name.into(),
            console,
            window,
        }
    }

    fn state(&self) -> String {
        virsh_ok(&["domstate", &self.name]).trim().to_string()
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = virsh(&["destroy", &self.name]);
        let _ = virsh(&["undefine", &self.name]);
        let _ = std::fs::remove_file(&self.window);
    }
}

fn vm_names(d: &Daemon) -> Vec<String> {
    let v: Value = serde_json::from_str(&d.ctl_ok(&["vm", "list", "--json"])).unwrap();
    v["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn libvirt_domains_get_hira_through_the_hook_and_leave_no_trace() {
    ensure_built();
    assert_can_run();
    let _libvirtd = LIBVIRTD.lock().unwrap_or_else(|e| e.into_inner());
    let d = Daemon::start_with(&["local"], &[], &["--socket-group", "libvirt-qemu"]);
    // QEMU's group reaches the guests' sockets, never the control socket.
    {
        use std::os::unix::fs::MetadataExt;
        let qemu_gid = nix::unistd::Group::from_name("libvirt-qemu")
            .unwrap()
            .unwrap()
            .gid
            .as_raw();
        let local = d.dir.path().join("local.sock").metadata().unwrap();
        assert_eq!((local.gid(), local.mode() & 0o777), (qemu_gid, 0o660));
        let control = d.dir.path().join("control.sock").metadata().unwrap();
        assert_eq!((control.gid(), control.mode() & 0o777), (0, 0o600));
    }
    let _hook = Hook::install();
    let pid = std::process::id();

    // One domain runs OpenCL programs, as natively, and is gone with its VM after.
    let programs = ["vecadd", "events"];
    let script = crate::vm::marked_script(&programs);
    let image = crate::vm::image_with("libvirt", &script, &programs);
    let a = Domain::define(&d, &format!("hira-e2e-{pid}-a"), "lva", 5, 1, &image);
    virsh_ok(&["start", &a.name]);
    wait_for("domain a to power off", Duration::from_secs(300), || {
        a.state() == "shut off"
    });
    let console = std::fs::read_to_string(&a.console).unwrap();
    let expected = crate::vm::marked_native(&programs);
    assert_eq!(
        crate::vm::guest_output(&console),
        expected,
        "{}",
        d.log_text()
    );
    wait_for("VM lva to be removed", Duration::from_secs(60), || {
        !vm_names(&d).contains(&"lva".to_string())
    });
    let ended = d.wait_idle(Duration::from_secs(60));
    let ours: Vec<_> = ended.iter().filter(|e| e["vm"] == "lva").collect();
    assert_eq!(ours.len(), 2, "{ended:?}");
    assert!(ours.iter().all(|e| e["data_plane"] == "rings"), "{ours:?}");
    assert!(!a.window.exists() && !d.dir.path().join("lva.vhost").exists());

    // Two at once, with different shares; destroyed, they leave nothing.
    // Each guest holds a session open without using the CPU (the program waits for
    // commands that never come), so that the two domains do not starve other tests.
    let long = crate::vm::image_with(
        "libvirt-idle",
        "sleep 600 | /hira/migrate 2>&1\n",
        &["migrate"],
    );
    let b = Domain::define(&d, &format!("hira-e2e-{pid}-b"), "lvb", 6, 1, &long);
    let c = Domain::define(&d, &format!("hira-e2e-{pid}-c"), "lvc", 7, 3, &long);
    virsh_ok(&["start", &b.name]);
    virsh_ok(&["start", &c.name]);
    let live =
        d.control(serde_json::json!({"cmd": "wait_live", "count": 2, "timeout_ms": 240_000}));
    assert_eq!(live["reached"], true, "{live}\n{}", d.log_text());
    let shares: Vec<(String, u64)> = live["status"]["vms"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["name"] == "lvb" || v["name"] == "lvc")
        .map(|v| {
            (
                v["name"].as_str().unwrap().into(),
                v["share"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shares, [("lvb".into(), 1), ("lvc".into(), 3)]);
    virsh_ok(&["destroy", &b.name]);
    virsh_ok(&["destroy", &c.name]);
    wait_for(
        "VMs lvb and lvc to be removed",
        Duration::from_secs(60),
        || {
            let names = vm_names(&d);
            !names.contains(&"lvb".to_string()) && !names.contains(&"lvc".to_string())
        },
    );
    let status = d.status();
    assert!(
        status["sessions"].as_array().unwrap().is_empty(),
        "{status}"
    );
    for vm in ["lvb", "lvc"] {
        assert!(
            status["vms"]
                .as_array()
                .unwrap()
                .iter()
                .all(|v| v["name"] != vm),
            "{status}"
        );
        assert!(!d.dir.path().join(format!("{vm}.vhost")).exists());
    }
    assert!(!b.window.exists() && !c.window.exists());
}

/// `scripts/quickstart --remove` when dropped: the quick start leaves nothing behind.
struct QuickStart;

impl QuickStart {
    fn remove() -> std::process::Output {
        Command::new(crate::support::workspace().join("scripts/quickstart"))
            .arg("--remove")
            .output()
            .unwrap()
    }
}

impl Drop for QuickStart {
    fn drop(&mut self) {
        let _ = Self::remove();
    }
}

/// The README's operator quick start, written down as `scripts/quickstart` (the README
/// test checks they agree), run on this machine: libvirt and the host's OpenCL, the
/// packages built and `hira-host` installed, its daemon started as its unit starts it,
/// libvirt's hook installed, a guest with the `hira-guest` package defined and started
/// with `virsh`. The guest's programs print what they print natively, and
/// `scripts/quickstart --remove` leaves no trace of any of it.
#[test]
fn the_operators_quick_start_runs_an_opencl_program_in_a_libvirt_domain() {
    ensure_built();
    assert_can_run();
    let _libvirtd = LIBVIRTD.lock().unwrap_or_else(|e| e.into_inner());
    // From nothing: what an interrupted run left goes first.
    let removed = QuickStart::remove();
    assert!(removed.status.success(), "{removed:?}");
    let quick = QuickStart;
    let out = Command::new(crate::support::workspace().join("scripts/quickstart"))
        // The guest kernel's packages, downloaded once for every VM test.
        .env("HIRA_VM_DEBS", bin_dir().join("hira-vm-debs"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string("/var/log/hira-vhost.log").unwrap_or_default()
    );
    // `hira-ctl status`: the packaged daemon's API servers see the device.
    assert!(stdout.contains("  opencl device: "), "{stdout}");
    // `hira-ctl list`, once the domain started: its VM, from the hook.
    assert!(
        stdout
            .lines()
            .any(|l| l.split_whitespace().next() == Some("hira-demo")),
        "{stdout}"
    );

    // What the guest ran (`clinfo -l; /hira/vecadd`), natively.
    let vendors = crate::support::Vendors::native();
    let native = |program: &Path, args: &[&str]| {
        let o = Command::new(program)
            .args(args)
            .env("OCL_ICD_VENDORS", vendors.dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{program:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let expected =
        native(Path::new("clinfo"), &["-l"]) + &native(&crate::support::c_program("vecadd"), &[]);
    assert_eq!(crate::vm::guest_output(&stdout), expected);

    drop(quick);
    assert!(
        !Command::new("dpkg")
            .args(["-s", "hira-host"])
            .output()
            .unwrap()
            .status
            .success(),
        "hira-host is purged"
    );
    assert!(!virsh(&["dominfo", "hira-demo"]).status.success());
    for gone in [
        HOOK,
        "/run/hira",
        "/dev/shm/hira-demo",
        "/var/lib/libvirt/images/hira-demo",
        "/etc/hira",
        "/usr/libexec/hira",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} is left");
    }
    let packaged = Command::new("pgrep")
        .args(["-f", "^/usr/libexec/hira/hira-vhost"])
        .output()
        .unwrap();
    assert!(
        !packaged.status.success(),
        "the quick start's daemon stopped"
    );
}
