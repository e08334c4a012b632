//! Reading the answer out of a reply.

use cairn_arith::{parse_reply, Reply};

#[test]
fn the_answer_is_the_last_integer() {
    let n = Reply::Number;
    assert_eq!(parse_reply("15"), n(15));
    assert_eq!(parse_reply(" 15.\n"), n(15));
    assert_eq!(parse_reply("7 + 8 = 15"), n(15));
    assert_eq!(parse_reply("The answer is 15, I think."), n(15));
    assert_eq!(parse_reply("12, 13"), n(13));
    assert_eq!(parse_reply("1,234"), n(1234));
    assert_eq!(parse_reply("-3"), n(-3));
    assert_eq!(parse_reply("it is -3"), n(-3));
    // A minus between operands is an operator, not a sign.
    assert_eq!(parse_reply("7-3"), n(3));
    assert_eq!(parse_reply("x-3"), n(3));
    // A sentence's full stop is not a decimal point.
    assert_eq!(parse_reply("It is 15. Or 16."), n(16));
    assert_eq!(
        parse_reply("１５ fullwidth digits are not digits here"),
        Reply::Missing
    );
}

#[test]
fn malformed_replies_are_missing_or_too_long() {
    assert_eq!(parse_reply(""), Reply::Missing);
    assert_eq!(parse_reply("fifteen"), Reply::Missing);
    assert_eq!(parse_reply("- , -"), Reply::Missing);
    assert_eq!(parse_reply("99999999999999999999"), Reply::TooLong);
    // Only the last integer counts: an earlier overflow does not matter.
    assert_eq!(parse_reply("99999999999999999999 or 4"), Reply::Number(4));
    assert_eq!(parse_reply("4 or 99999999999999999999"), Reply::TooLong);
    // A fraction is never a whole-number answer, even when it rounds to one.
    assert_eq!(parse_reply("9 minus 5 equals 4.4."), Reply::Decimal);
    assert_eq!(parse_reply("4.0"), Reply::Decimal);
    assert_eq!(parse_reply("0.5 or 4"), Reply::Number(4));
}
