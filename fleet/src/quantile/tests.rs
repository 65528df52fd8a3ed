use super::*;

#[test]
fn nearest_rank_is_a_value_of_the_sample_at_ceil_q_n() {
    let v: Vec<f64> = (1..=10).map(f64::from).collect();
    assert_eq!(nearest_rank(&v, 0.0), Some(1.0));
    assert_eq!(nearest_rank(&v, 0.5), Some(5.0));
    assert_eq!(nearest_rank(&v, 0.51), Some(6.0));
    assert_eq!(nearest_rank(&v, 0.9), Some(9.0));
    assert_eq!(nearest_rank(&v, 0.99), Some(10.0));
    assert_eq!(nearest_rank::<f64>(&[], 0.5), None);
    assert_eq!(of(&[3.0, f64::NAN, 1.0, 2.0], 0.5), Some(2.0));
    let d = Dist::of(vec![4.0, 1.0, 3.0, 2.0, f64::INFINITY]);
    assert_eq!(
        (d.count, d.p50, d.p90, d.max, d.mean),
        (4, 2.0, 4.0, 4.0, 2.5)
    );
    assert_eq!(Dist::of(Vec::new()), Dist::default());
}

#[test]
fn median_of_rounds_averages_the_middle_two() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    assert_eq!(median(&[f64::NAN]), None);
}

#[test]
fn histogram_quantiles_match_the_exact_ones_within_a_percent() {
    let mut h = histogram();
    let v: Vec<f64> = (1..=1000).map(|i| f64::from(i) * 0.37).collect();
    for &x in &v {
        record_ms(&mut h, x);
    }
    record_ms(&mut h, -1.0);
    let (e, a) = (Dist::of(v), Dist::of_us(&h));
    assert_eq!(a.count, 1001);
    for (x, y) in [
        (e.p50, a.p50),
        (e.p90, a.p90),
        (e.p99, a.p99),
        (e.max, a.max),
    ] {
        assert!((y - x).abs() <= 0.01 * x, "{x} vs {y}");
    }
}
