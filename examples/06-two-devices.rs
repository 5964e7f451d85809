//! Two devices: one pool per device, the current device, per-device current streams, and a copy
//! between devices. The host backend simulates two devices (`GPUMEM_HOST_DEVICES`, default 2),
//! so this runs on any machine.
//!
//! `cargo run --example 06-two-devices` (host backend; `--features cuda` on a machine with two
//! NVIDIA GPUs). With one device it says so and stops.

use gpumem::{Device, MemoryPool, Stream};

fn main() -> gpumem::Result<()> {
    let n = Device::count()?;
    println!("{n} device(s)");
    if n < 2 {
        println!("this example needs two devices");
        return Ok(());
    }
    let pool = MemoryPool::new();

    // Each device's allocation comes from that device's pool.
    let on0 = {
        let _d = Device::new(0).enter()?;
        pool.malloc(4096)?
    };
    let on1 = {
        let _d = Device::new(1).enter()?;
        pool.malloc(4096)?
    };
    println!("allocated on devices {} and {}", on0.device_id(), on1.device_id());
    for d in 0..2 {
        let _d = Device::new(d).enter()?;
        println!("device {d}'s pool: {} bytes used", pool.used_bytes());
    }

    // A copy between devices (peer access where the devices allow it).
    on0.memset(0x5a, 4096)?;
    let peer = Device::new(0).can_access_peer(&Device::new(1))?;
    on1.copy_from_device(&on0, 4096)?;
    let mut out = [0u8; 4];
    on1.copy_to_host(&mut out, 4)?;
    println!("device 0 -> device 1 copy (peer access: {peer}): {out:02x?}");

    // Each device has its own current stream on each thread.
    let s0 = {
        let _d = Device::new(0).enter()?;
        Stream::non_blocking()?
    };
    let _d0 = Device::new(0).enter()?;
    let _current = s0.enter()?;
    {
        let _d1 = Device::new(1).enter()?;
        println!(
            "with device 1 current, its current stream is its default: {:?}",
            gpumem::get_current_stream()
        );
        // A stream of device 0 cannot be made current while device 1 is current.
        if let Err(e) = s0.use_stream() {
            println!("using device 0's stream on device 1: {e}");
        }
    }
    println!("back on device 0, the current stream is {:?}", gpumem::get_current_stream());

    // Memory and a stream of different devices are refused together.
    if let Err(e) = on1.memset_async(0, 16, Some(&s0)) {
        println!("device 1 memory on a device 0 stream: {e}");
    }
    Ok(())
}
