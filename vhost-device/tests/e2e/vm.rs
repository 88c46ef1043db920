//! A real Linux guest under QEMU (TCG): Debian's cloud kernel and an initramfs built
//! by `scripts/vm-image` with busybox, the virtio and vsock modules, the OpenCL ICD
//! loader and Hira's ICD.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use crate::support::{bin_dir, ensure_built, run_with_timeout, shim, workspace};

#[test]
fn linux_guest_boots_with_vsock_and_its_loader_finds_the_hira_icd() {
    ensure_built();
    assert!(
        Command::new("qemu-system-x86_64")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "qemu-system-x86_64 is missing (scripts/test installs it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::write(&run, "#!/bin/sh\nls /dev/vsock\ncut -d' ' -f1 /proc/modules | sort | tr '\\n' ' '; echo\nclinfo 2>&1 | head -3\n").unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    let image = bin_dir().join("hira-vm");
    let built = Command::new(workspace().join("scripts/vm-image"))
        .arg(&image)
        .arg(shim())
        .arg(&run)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "vm-image failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args([
        "-accel",
        "tcg",
        "-m",
        "512",
        "-smp",
        "1",
        "-nographic",
        "-no-reboot",
        "-kernel",
    ])
    .arg(image.join("vmlinuz"))
    .arg("-initrd")
    .arg(image.join("initramfs.cpio.gz"))
    .args(["-append", "console=ttyS0 quiet panic=-1"]);
    let out = run_with_timeout(&mut qemu, Duration::from_secs(180));
    let console = String::from_utf8_lossy(&out.stdout);
    assert!(
        console.contains("HIRA-GUEST-UP") && console.contains("HIRA-GUEST-DONE"),
        "the guest booted and ran:\n{console}"
    );
    assert!(
        !console.contains("HIRA-GUEST-MODULE-FAILED"),
        "every module loaded:\n{console}"
    );
    for module in ["virtio_pci", "vsock", "vmw_vsock_virtio_transport"] {
        assert!(
            console.contains(&format!("{module} ")),
            "{module} is loaded:\n{console}"
        );
    }
    assert!(
        console.contains("/dev/vsock"),
        "the vsock device node exists:\n{console}"
    );
    // No transport to the host yet: the guest's loader loads Hira's ICD, which says
    // it cannot reach the host and lists no platform.
    assert!(
        console.contains("Hira OpenCL is unavailable"),
        "the loader loaded Hira's ICD:\n{console}"
    );
    assert!(
        console.contains("Number of platforms                               0"),
        "{console}"
    );
}
