use gpumem_core::host::Host;
use gpumem_core::SingleDeviceMemoryPool;
fn main() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    drop(pool.malloc_pooled(512).unwrap());
    for _ in 0..1_000_000 { drop(std::hint::black_box(pool.malloc_pooled(std::hint::black_box(512)).unwrap())); }
}
