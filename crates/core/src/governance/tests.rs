use serde_json::json;

use super::*;

/// 2026-11-25T10:30:00Z.
const NOV_25: i64 = 1_795_602_600;

#[test]
fn periods_start_and_end_on_utc_calendar_boundaries() {
    // (period, now, start, end) as dates: checked against `date -u -d`.
    let table = [
        (
            BudgetPeriod::Day,
            NOV_25,
            1_795_564_800,
            Some(1_795_651_200),
        ),
        (
            BudgetPeriod::Month,
            NOV_25,
            1_793_491_200,
            Some(1_796_083_200),
        ),
        (BudgetPeriod::Total, NOV_25, 0, None),
        // December rolls into the next year.
        (
            BudgetPeriod::Month,
            1_798_761_599,
            1_796_083_200,
            Some(1_798_761_600),
        ),
        // The first second of a month is in that month.
        (
            BudgetPeriod::Month,
            1_796_083_200,
            1_796_083_200,
            Some(1_798_761_600),
        ),
        // February of a leap year.
        (
            BudgetPeriod::Month,
            1_709_164_800,
            1_706_745_600,
            Some(1_709_251_200),
        ),
    ];
    for (period, now, start, end) in table {
        assert_eq!(period.start(now), start, "{period:?} start of {now}");
        assert_eq!(period.end(now), end, "{period:?} end of {now}");
    }
}

#[test]
fn civil_dates_round_trip_over_four_centuries() {
    for days in (-800_000..800_000).step_by(97) {
        let (year, month, day) = civil_from_days(days);
        assert_eq!(
            days_from_civil(year, month, day),
            days,
            "{year}-{month}-{day}"
        );
    }
}

#[test]
fn a_limits_patch_sets_removes_and_keeps_fields() {
    let before = RateLimits {
        rpm: Some(10),
        tpm: Some(1000),
        max_concurrent: None,
    };
    let after = before
        .patched(&json!({"rpm": 20, "tpm": null, "max_concurrent": 2}))
        .unwrap();
    assert_eq!(
        after,
        RateLimits {
            rpm: Some(20),
            tpm: None,
            max_concurrent: Some(2)
        }
    );
    assert_eq!(before.patched(&json!({})).unwrap(), before);
    assert!(before.patched(&json!(null)).unwrap().is_empty());
}

#[test]
fn bad_limits_budgets_and_prices_name_their_field() {
    let limits = RateLimits::default();
    let table: Vec<(Result<(), InvalidRequest>, &str)> = vec![
        (limits.patched(&json!({"rpm": -1})).map(drop), "limits.rpm"),
        (
            limits.patched(&json!({"tpm": "many"})).map(drop),
            "limits.tpm",
        ),
        (
            limits.patched(&json!({"max_concurrent": 1.5})).map(drop),
            "limits.max_concurrent",
        ),
        (limits.patched(&json!({"rph": 1})).map(drop), "limits.rph"),
        (limits.patched(&json!([1])).map(drop), "limits"),
        (
            Budget::parse(&json!({"usd": -1, "period": "day"})).map(drop),
            "budget.usd",
        ),
        (
            Budget::parse(&json!({"usd": 1, "period": "week"})).map(drop),
            "budget.period",
        ),
        (
            Budget::parse(&json!({"period": "day"})).map(drop),
            "budget.usd",
        ),
        (
            Budget::parse(&json!({"usd": 1, "period": "day", "x": 1})).map(drop),
            "budget.x",
        ),
        (Budget::parse(&json!(5)).map(drop), "budget"),
        (
            Pricing::parse(&json!({"input_per_mtok": -0.5, "output_per_mtok": 1})).map(drop),
            "pricing.input_per_mtok",
        ),
        (
            Pricing::parse(&json!({"input_per_mtok": 1})).map(drop),
            "pricing.output_per_mtok",
        ),
        (
            Pricing::parse(
                &json!({"input_per_mtok": 1, "output_per_mtok": 1, "cached_input_per_mtok": "x"}),
            )
            .map(drop),
            "pricing.cached_input_per_mtok",
        ),
    ];
    for (parsed, param) in table {
        let error = parsed.expect_err(param);
        assert_eq!(error.param.as_deref(), Some(param), "{}", error.message);
    }
}

#[test]
fn budgets_and_prices_read_their_fields() {
    assert_eq!(
        Budget::parse(&json!({"usd": 10.5, "period": "month"})).unwrap(),
        Some(Budget {
            usd: 10.5,
            period: BudgetPeriod::Month
        })
    );
    assert_eq!(Budget::parse(&json!(null)).unwrap(), None);
    assert_eq!(
        Pricing::parse(&json!({"input_per_mtok": 3, "output_per_mtok": 15})).unwrap(),
        Some(Pricing {
            input_per_mtok: 3.0,
            cached_input_per_mtok: None,
            output_per_mtok: 15.0
        })
    );
}

#[test]
fn cost_prices_cached_input_at_its_own_rate() {
    let pricing = Pricing {
        input_per_mtok: 3.0,
        cached_input_per_mtok: Some(0.3),
        output_per_mtok: 15.0,
    };
    let usage = Usage {
        input_tokens: 1_000_000,
        output_tokens: 100_000,
        cached_tokens: 400_000,
        reasoning_tokens: 50_000,
    };
    // 600k uncached at 3, 400k cached at 0.3, 100k output (reasoning included) at 15.
    let expected = 1.8 + 0.12 + 1.5;
    assert!((pricing.cost(&usage) - expected).abs() < 1e-12);
    let without_cached_price = Pricing {
        cached_input_per_mtok: None,
        ..pricing
    };
    assert!((without_cached_price.cost(&usage) - 4.5).abs() < 1e-12);
}

#[test]
fn the_tighter_standing_is_the_one_with_less_left() {
    let key = Standing {
        limit: 10,
        remaining: 3,
        reset_secs: 20,
    };
    let project = Standing {
        limit: 100,
        remaining: 50,
        reset_secs: 20,
    };
    assert_eq!(Standing::tighter(Some(key), Some(project)), Some(key));
    assert_eq!(Standing::tighter(Some(project), Some(key)), Some(key));
    assert_eq!(Standing::tighter(None, Some(project)), Some(project));
    assert_eq!(Standing::tighter(None, None), None);
}

#[test]
fn resets_read_as_openai_writes_them() {
    for (secs, text) in [
        (0, "0s"),
        (59, "59s"),
        (60, "1m0s"),
        (361, "6m1s"),
        (3723, "1h2m3s"),
    ] {
        assert_eq!(reset_duration(secs), text);
    }
    assert_eq!(window_start(NOV_25 + 59), NOV_25);
    assert_eq!(window_start(NOV_25 + 60), NOV_25 + 60);
}
