use super::super::runq::lcg;
use super::*;

/// The slice as computed before the shortcut: always through the division.
fn divided(period: Ns, weight: u64, load: u64, min_gran: Ns) -> Ns {
    let share = period as i64 as f64 * (weight as f64 / load.max(1) as i64 as f64);
    (share as i64 as Ns).max(min_gran)
}

#[test]
fn the_root_slice_shortcut_gives_what_the_division_gives() {
    let weights = [15u64, 1024, 1277, 88761];
    let mut s = 7;
    let mut shortcuts = 0;
    for i in 0..200_000u64 {
        let min_gran = 750_000 + lcg(&mut s) % 3_000_000;
        let nr = 1 + lcg(&mut s) % 300;
        let period = (nr * min_gran).max(24_000_000);
        let weight = weights[lcg(&mut s) as usize % 4];
        // Loads around the point where the share is exactly min_gran, and random ones.
        let load = match i % 3 {
            0 => {
                let at = (period as u128 * weight as u128 / min_gran as u128) as u64;
                at + lcg(&mut s) % 16 - 8
            }
            1 => weight * nr,
            _ => lcg(&mut s) % 30_000_000,
        };
        let want = divided(period, weight, load, min_gran);
        assert_eq!(
            root_slice(period, weight, load, min_gran),
            want,
            "{period} {weight} {load} {min_gran}"
        );
        shortcuts +=
            (period as u128 * weight as u128 <= min_gran as u128 * load.max(1) as u128) as u32;
    }
    assert!(shortcuts > 50_000, "{shortcuts} shortcuts");
}
