//! Calendar dates from day counts, for keys that name a day or a second in UTC.

/// The proleptic Gregorian date (year, month, day) of a count of days since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
///
/// ```
/// assert_eq!(jobguard_core::date::civil_from_days(0), (1970, 1, 1));
/// assert_eq!(jobguard_core::date::civil_from_days(20_428), (2025, 12, 6));
/// ```
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}
