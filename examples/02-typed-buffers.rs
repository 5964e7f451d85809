//! Typed buffers: `DeviceBuffer<T>` for any `bytemuck::Pod` element type, on the pool.
//!
//! `cargo run --example 02-typed-buffers` (host backend; `--features cuda` on an NVIDIA GPU).
//! It uploads a `Vec<f32>`, works on views of it, copies between buffers on a stream and reads
//! the results back, printing each step; the byte API with CuPy's names is underneath.

use gpumem::{DeviceBuffer, Stream};

fn main() -> gpumem::Result<()> {
    let data: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let x = DeviceBuffer::<f32>::from_slice(&data)?;
    println!(
        "uploaded {} f32 ({} bytes, chunk of {} bytes): {:?}",
        x.len(),
        x.size_in_bytes(),
        x.as_pointer().size(),
        x.to_vec()?
    );

    // A view of elements 4..8, checked against the 8 elements asked for, not the 512-byte chunk.
    let tail = x.slice(4..)?;
    tail.fill(-1.0)?;
    println!("after filling elements 4..8 with -1:   {:?}", x.to_vec()?);
    match x.slice(6..10) {
        Err(e) => println!("a view of elements 6..10 is refused:  {e}"),
        Ok(_) => unreachable!("8 elements have no element 9"),
    }

    // Asynchronous forms on a stream: a zeroed buffer, a device-to-device copy, a fill.
    let s = Stream::non_blocking()?;
    let y = DeviceBuffer::<f32>::zeros(8)?;
    y.copy_from_buffer_async(&x, Some(&s))?;
    y.slice(..2)?.fill_async(42.0, Some(&s))?;
    s.synchronize()?;
    println!("copied on a stream, then elements 0..2 filled with 42: {:?}", y.to_vec()?);

    // Any Pod type: u32 with an element-wise fill and a round trip through a slice.
    let counts = DeviceBuffer::<u32>::from_elem(7, 4)?;
    let mut out = [0u32; 4];
    counts.copy_to_slice(&mut out)?;
    println!("u32 buffer filled with 7: {out:?}");

    // Lengths must match: a copy of 3 elements into a buffer of 4 is an error, nothing written.
    if let Err(e) = counts.copy_from_slice(&[1, 2, 3]) {
        println!("a 3-element copy into 4 elements is refused: {e}");
    }
    Ok(())
}
