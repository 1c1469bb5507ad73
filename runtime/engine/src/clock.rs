//! Dates as chat templates ask for them: `strftime_now(format)`, which
//! transformers gives templates (Python's `datetime.now().strftime`), here
//! in UTC. The conversions are the proleptic Gregorian calendar's, from
//! days since 1970-01-01.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// A moment in UTC, broken into what `strftime` prints.
struct Civil {
    year: i64,
    /// 1 to 12.
    month: u32,
    /// 1 to 31.
    day: u32,
    /// 0 (Monday) to 6.
    weekday: usize,
    /// 1 to 366.
    day_of_year: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

impl Civil {
    fn at(seconds: i64) -> Civil {
        let days = seconds.div_euclid(86_400);
        let of_day = seconds.rem_euclid(86_400) as u32;
        // Days to (year, month, day): eras of 400 years from 0000-03-01.
        let shifted = days + 719_468;
        let era = shifted.div_euclid(146_097);
        let of_era = shifted.rem_euclid(146_097);
        let year_of_era = (of_era - of_era / 1460 + of_era / 36_524 - of_era / 146_096) / 365;
        let day_of_march_year = of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
        let month_from_march = (5 * day_of_march_year + 2) / 153;
        let day = (day_of_march_year - (153 * month_from_march + 2) / 5 + 1) as u32;
        let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 } as u32;
        let year = year_of_era + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        let before_month = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][month as usize - 1];
        let day_of_year = before_month + day + u32::from(leap && month > 2);
        Civil {
            year,
            month,
            day,
            weekday: (days + 3).rem_euclid(7) as usize,
            day_of_year,
            hour: of_day / 3600,
            minute: of_day / 60 % 60,
            second: of_day % 60,
        }
    }

    /// Python's `strftime` for the directives templates use; any other is
    /// kept as written, as glibc keeps an unknown one.
    fn format(&self, format: &str) -> String {
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let hour12 = if self.hour.is_multiple_of(12) { 12 } else { self.hour % 12 };
            match chars.next() {
                Some('Y') => out.push_str(&self.year.to_string()),
                Some('y') => out.push_str(&format!("{:02}", self.year.rem_euclid(100))),
                Some('m') => out.push_str(&format!("{:02}", self.month)),
                Some('d') => out.push_str(&format!("{:02}", self.day)),
                Some('e') => out.push_str(&format!("{:2}", self.day)),
                Some('j') => out.push_str(&format!("{:03}", self.day_of_year)),
                Some('B') => out.push_str(MONTHS[self.month as usize - 1]),
                Some('b') => out.push_str(&MONTHS[self.month as usize - 1][..3]),
                Some('A') => out.push_str(WEEKDAYS[self.weekday]),
                Some('a') => out.push_str(&WEEKDAYS[self.weekday][..3]),
                Some('H') => out.push_str(&format!("{:02}", self.hour)),
                Some('I') => out.push_str(&format!("{hour12:02}")),
                Some('p') => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                Some('M') => out.push_str(&format!("{:02}", self.minute)),
                Some('S') => out.push_str(&format!("{:02}", self.second)),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        out
    }
}

/// Now, in UTC, as `strftime` formats it.
pub fn strftime_now(format: &str) -> String {
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs() as i64);
    Civil::at(seconds).format(format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_format_as_python_formats_them() {
        assert_eq!(Civil::at(0).format("%Y-%m-%d %A %H:%M:%S"), "1970-01-01 Thursday 00:00:00");
        // 2024-07-26 13:05:09 UTC, Llama 3.1's default date.
        let moment = Civil::at(1_721_999_109);
        assert_eq!(moment.format("%d %b %Y"), "26 Jul 2024");
        assert_eq!(moment.format("%B %e, %y %a %j %I%p %%"), "July 26, 24 Fri 208 01PM %");
        // A leap day, and the last day of a leap year.
        assert_eq!(Civil::at(951_782_400).format("%Y-%m-%d %j"), "2000-02-29 060");
        assert_eq!(Civil::at(1_735_603_200).format("%Y-%m-%d %j"), "2024-12-31 366");
        assert_eq!(Civil::at(-86_400).format("%Y-%m-%d"), "1969-12-31");
    }
}
