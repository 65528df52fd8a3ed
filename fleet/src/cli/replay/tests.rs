use super::*;
use crate::report::model::Requests;

fn requests(completed: u64, errors: u64) -> Requests {
    Requests {
        completed,
        errors,
        errors_by_kind: [("connect".to_owned(), errors)].into(),
        ..Requests::default()
    }
}

#[test]
fn a_replay_fails_when_nothing_succeeded_or_errors_pass_the_threshold() {
    assert!(check_errors(&requests(0, 0), None).is_ok(), "nothing sent");
    assert!(check_errors(&requests(9, 1), None).is_ok());
    let e = check_errors(&requests(0, 3), Some(1.0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no request succeeded: 3 of 3 failed (connect 3)"),
        "{e}"
    );
    assert!(
        check_errors(&requests(9, 1), Some(0.1)).is_ok(),
        "at the threshold"
    );
    let e = check_errors(&requests(8, 2), Some(0.1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("2 of 10 requests failed (20.00 %"), "{e}");
}

#[test]
fn the_error_rate_is_a_fraction() {
    assert_eq!(fraction("0.05"), Ok(0.05));
    assert_eq!(fraction("1"), Ok(1.0));
    assert!(fraction("1.5").is_err());
    assert!(fraction("-0.1").is_err());
    assert!(fraction("NaN").is_err());
}
