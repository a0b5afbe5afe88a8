//! Governance of keys and projects (SPEC 13): rate limits, budgets, prices, the windows and periods they are
//! counted in, and the admission decision over both scopes (the key's and its project's; the tighter wins).
//!
//! Pure: the caller passes the time and the counts it knows; the gateway's `governance` module keeps the counts.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::request::InvalidRequest;
use crate::steps::Usage;

mod changes;

pub use changes::{check_expires_at, Change, LimitChanges, MAX_LIMIT};

/// The length of a rate-limit window, in seconds: `rpm` and `tpm` count per minute.
pub const WINDOW_SECS: i64 = 60;

/// The rate limits of one scope (a key or a project); `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimits {
    /// Creates per minute, WebSocket turns included.
    pub rpm: Option<u64>,
    /// Model tokens (input plus output) per minute.
    pub tpm: Option<u64>,
    /// Responses running at once.
    pub max_concurrent: Option<u64>,
}

impl RateLimits {
    pub fn is_empty(&self) -> bool {
        self.rpm.is_none() && self.tpm.is_none() && self.max_concurrent.is_none()
    }

    /// Reads a `PATCH`'s `limits` over `self`: a field given sets it, a field given as `null` removes it, a field
    /// left out keeps it, and `limits: null` removes them all. Every error names its field (`limits.rpm`).
    pub fn patched(self, value: &Value) -> Result<RateLimits, InvalidRequest> {
        let object = match value {
            Value::Null => return Ok(RateLimits::default()),
            Value::Object(object) => object,
            _ => return Err(invalid("'limits' must be an object or null.", "limits")),
        };
        let mut limits = self;
        for (field, given) in object {
            let slot = match field.as_str() {
                "rpm" => &mut limits.rpm,
                "tpm" => &mut limits.tpm,
                "max_concurrent" => &mut limits.max_concurrent,
                other => {
                    return Err(invalid(
                        format!(
                            "Unknown limit '{other}': expected 'rpm', 'tpm' or 'max_concurrent'."
                        ),
                        &format!("limits.{other}"),
                    ))
                }
            };
            *slot = match given {
                Value::Null => None,
                given => Some(whole_number(given, &format!("limits.{field}"))?),
            };
        }
        Ok(limits)
    }
}

/// A whole number of zero or more, or an error naming `param`.
fn whole_number(value: &Value, param: &str) -> Result<u64, InvalidRequest> {
    value.as_u64().ok_or_else(|| {
        invalid(
            format!("'{param}' must be a whole number of zero or more, or null to remove it."),
            param,
        )
    })
}

/// A finite amount of zero or more, or an error naming `param`.
fn amount(value: Option<&Value>, param: &str) -> Result<f64, InvalidRequest> {
    match value.and_then(Value::as_f64) {
        Some(amount) if amount.is_finite() && amount >= 0.0 => Ok(amount),
        _ => Err(invalid(
            format!("'{param}' must be a number of zero or more."),
            param,
        )),
    }
}

fn invalid(message: impl Into<String>, param: &str) -> InvalidRequest {
    InvalidRequest::new(message, param).with_code("invalid_value")
}

/// Over which time a budget's spend is summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetPeriod {
    /// The current UTC day.
    Day,
    /// The current UTC calendar month.
    Month,
    /// All time.
    Total,
}

impl BudgetPeriod {
    pub const ALL: [BudgetPeriod; 3] =
        [BudgetPeriod::Day, BudgetPeriod::Month, BudgetPeriod::Total];

    pub fn parse(name: &str) -> Option<BudgetPeriod> {
        match name {
            "day" => Some(BudgetPeriod::Day),
            "month" => Some(BudgetPeriod::Month),
            "total" => Some(BudgetPeriod::Total),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Day => "day",
            BudgetPeriod::Month => "month",
            BudgetPeriod::Total => "total",
        }
    }

    /// When the period that holds `now` (Unix seconds) began: midnight UTC, the first of the month at midnight
    /// UTC, or the epoch.
    pub fn start(self, now: i64) -> i64 {
        let day = now.div_euclid(86_400);
        match self {
            BudgetPeriod::Day => day * 86_400,
            BudgetPeriod::Month => {
                let (year, month, _) = civil_from_days(day);
                days_from_civil(year, month, 1) * 86_400
            }
            BudgetPeriod::Total => 0,
        }
    }

    /// When the period that holds `now` ends (`None` for `total`, which never does).
    pub fn end(self, now: i64) -> Option<i64> {
        let day = now.div_euclid(86_400);
        match self {
            BudgetPeriod::Day => Some((day + 1) * 86_400),
            BudgetPeriod::Month => {
                let (year, month, _) = civil_from_days(day);
                let (year, month) = if month == 12 {
                    (year + 1, 1)
                } else {
                    (year, month + 1)
                };
                Some(days_from_civil(year, month, 1) * 86_400)
            }
            BudgetPeriod::Total => None,
        }
    }
}

/// Year, month (1–12) and day (1–31) of a count of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a civil date (the inverse of [`civil_from_days`]).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month = i64::from(month);
    let day_of_year =
        (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// A spending limit in USD over a period.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    pub usd: f64,
    pub period: BudgetPeriod,
}

impl Budget {
    /// Reads a `budget` field: an object with `usd` and `period`, or `null` (no budget).
    pub fn parse(value: &Value) -> Result<Option<Budget>, InvalidRequest> {
        let object = match value {
            Value::Null => return Ok(None),
            Value::Object(object) => object,
            _ => return Err(invalid("'budget' must be an object or null.", "budget")),
        };
        if let Some(other) = object
            .keys()
            .find(|k| !matches!(k.as_str(), "usd" | "period"))
        {
            return Err(invalid(
                format!("Unknown budget field '{other}': expected 'usd' and 'period'."),
                &format!("budget.{other}"),
            ));
        }
        let usd = amount(object.get("usd"), "budget.usd")?;
        let period = object
            .get("period")
            .and_then(Value::as_str)
            .and_then(BudgetPeriod::parse)
            .ok_or_else(|| {
                invalid(
                    "'budget.period' must be one of 'day', 'month' or 'total'.",
                    "budget.period",
                )
            })?;
        Ok(Some(Budget { usd, period }))
    }
}

/// A deployment's prices in USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pricing {
    pub input_per_mtok: f64,
    /// Cached input tokens' price; without it they cost as other input tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_mtok: Option<f64>,
    pub output_per_mtok: f64,
}

impl Pricing {
    /// Reads a `pricing` field: an object with `input_per_mtok`, `output_per_mtok` and optionally
    /// `cached_input_per_mtok`, or `null` (no pricing: calls cost nothing and are counted in tokens).
    pub fn parse(value: &Value) -> Result<Option<Pricing>, InvalidRequest> {
        let object = match value {
            Value::Null => return Ok(None),
            Value::Object(object) => object,
            _ => return Err(invalid("'pricing' must be an object or null.", "pricing")),
        };
        const FIELDS: [&str; 3] = ["input_per_mtok", "cached_input_per_mtok", "output_per_mtok"];
        if let Some(other) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(invalid(
                format!(
                    "Unknown pricing field '{other}': expected 'input_per_mtok', 'cached_input_per_mtok' and 'output_per_mtok'."
                ),
                &format!("pricing.{other}"),
            ));
        }
        let cached_input_per_mtok = match object.get("cached_input_per_mtok") {
            None | Some(Value::Null) => None,
            given => Some(amount(given, "pricing.cached_input_per_mtok")?),
        };
        Ok(Some(Pricing {
            input_per_mtok: amount(object.get("input_per_mtok"), "pricing.input_per_mtok")?,
            cached_input_per_mtok,
            output_per_mtok: amount(object.get("output_per_mtok"), "pricing.output_per_mtok")?,
        }))
    }

    /// What `usage` costs in USD. Cached input tokens are part of the input tokens, priced at their own rate
    /// where one is set; reasoning tokens are part of the output tokens.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let cached = usage.cached_tokens.min(usage.input_tokens);
        let uncached = usage.input_tokens - cached;
        let cached_price = self.cached_input_per_mtok.unwrap_or(self.input_per_mtok);
        (uncached as f64 * self.input_per_mtok
            + cached as f64 * cached_price
            + usage.output_tokens as f64 * self.output_per_mtok)
            / 1_000_000.0
    }
}

/// What a key and its project are held to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Governance {
    pub limits: RateLimits,
    pub budget: Option<Budget>,
}

impl Governance {
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty() && self.budget.is_none()
    }
}

/// The start of the rate-limit window that holds `now` (Unix seconds).
pub fn window_start(now: i64) -> i64 {
    now.div_euclid(WINDOW_SECS) * WINDOW_SECS
}

/// One counted limit as it stands for a request: the limit, what is left of it in this window, and when the
/// window resets (seconds from now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub limit: u64,
    pub remaining: u64,
    pub reset_secs: u64,
}

impl Standing {
    /// The tighter of two standings: the one with less left (the later reset on a tie).
    pub fn tighter(a: Option<Standing>, b: Option<Standing>) -> Option<Standing> {
        match (a, b) {
            (Some(a), Some(b)) => Some(
                if (b.remaining, a.reset_secs) < (a.remaining, b.reset_secs) {
                    b
                } else {
                    a
                },
            ),
            (a, b) => a.or(b),
        }
    }
}

/// OpenAI's duration format of the `x-ratelimit-reset-*` headers: `1s`, `6m0s`, `1h2m3s`.
pub fn reset_duration(secs: u64) -> String {
    let (hours, minutes, seconds) = (secs / 3600, secs / 60 % 60, secs % 60);
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, _) => format!("{minutes}m{seconds}s"),
        _ => format!("{hours}h{minutes}m{seconds}s"),
    }
}

#[cfg(test)]
mod tests;
