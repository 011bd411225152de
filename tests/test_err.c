/*
 * test_err — kb_err: code names and values, message formatting, prefixing and the NULL errbuf.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "kb_err.h"

static void test_strerror_names(void **state)
{
    (void)state;
    assert_string_equal(kb_strerror(KB_ERR_OK), "success");
    assert_string_equal(kb_strerror(KB_ERR_NOMEM), "out of host memory");
    assert_string_equal(kb_strerror(KB_ERR_INVAL), "invalid argument");
    assert_string_equal(kb_strerror(KB_ERR_DEADLOCK),
                        "deadlock: fibers wait and no event is pending");
    assert_string_equal(kb_strerror(KB_ERR_STATE), "invalid state for this call");
    assert_string_equal(kb_strerror(KB_ERR_USAGE), "usage error");
    assert_string_equal(kb_strerror(KB_ERR_NOFIT), "the run does not fit the device's memory");
    assert_int_equal(KB_ERR_NOFIT, KB_ERR_MIN_);
}

/* Every code of the table has its own name and short name; anything else is "unknown error"
 * and no short name. */
static const int all_codes[] = {
#define CODE_(name, value, lname, desc) KB_ERR_##name,
    KB_ERR_TABLE(CODE_)
#undef CODE_
};
#define NCODES (sizeof all_codes / sizeof all_codes[0])

static int is_code(int c)
{
    for (size_t i = 0; i < NCODES; i++)
        if (all_codes[i] == c)
            return 1;
    return 0;
}

static void test_strerror_all_distinct(void **state)
{
    (void)state;
    for (size_t a = 0; a < NCODES; a++) {
        const char *sa = kb_strerror(all_codes[a]);
        assert_non_null(sa);
        assert_true(strlen(sa) > 0);
        assert_string_not_equal(sa, "unknown error");
        assert_non_null(kb_err_name(all_codes[a]));
        assert_true(all_codes[a] <= 0 && all_codes[a] >= KB_ERR_MIN_);
        for (size_t b = a + 1; b < NCODES; b++) {
            assert_int_not_equal(all_codes[a], all_codes[b]);
            assert_string_not_equal(sa, kb_strerror(all_codes[b]));
            assert_string_not_equal(kb_err_name(all_codes[a]), kb_err_name(all_codes[b]));
        }
    }
    for (int c = KB_ERR_MIN_ - 1; c <= 1; c++)
        if (!is_code(c)) {
            assert_string_equal(kb_strerror(c), "unknown error");
            assert_null(kb_err_name(c));
        }
    assert_string_equal(kb_strerror(-1000), "unknown error");
}

/* The values users and saved sweep rows hold never change; retired values stay unused. */
static void test_codes_stable(void **state)
{
    (void)state;
    assert_int_equal(KB_ERR_NOMEM, -1);
    assert_int_equal(KB_ERR_INVAL, -2);
    assert_int_equal(KB_ERR_CONFIG, -3);
    assert_int_equal(KB_ERR_RANGE, -4);
    assert_int_equal(KB_ERR_NOSPACE, -5);
    assert_int_equal(KB_ERR_NOTFOUND, -6);
    assert_int_equal(KB_ERR_DEADLOCK, -7);
    assert_int_equal(KB_ERR_IO, -8);
    assert_int_equal(KB_ERR_DEVICE, -9);
    assert_int_equal(KB_ERR_UNSUPPORTED, -10);
    assert_int_equal(KB_ERR_VERIFY, -11);
    assert_int_equal(KB_ERR_STATE, -12);
    assert_int_equal(KB_ERR_UNWIRED, -13); /* kb_ipcq.h's KB_ERR_DIRECTION */
    assert_int_equal(KB_ERR_USAGE, -15);
    assert_int_equal(KB_ERR_NOFIT, -16);
    assert_string_equal(kb_err_name(KB_ERR_NOFIT), "nofit");
    assert_false(is_code(-14)); /* was ABORTED, never returned */
    assert_string_equal(kb_err_name(KB_ERR_NOSPACE), "nospace");
    assert_string_equal(kb_err_name(KB_ERR_OK), "ok");
}

static void test_err_set_formats_and_returns_code(void **state)
{
    kb_errbuf eb;

    (void)state;
    memset(&eb, 'x', sizeof eb);
    assert_int_equal(kb_err_set(&eb, KB_ERR_RANGE, "pe %d: offset 0x%x of %s", 5, 0x1200u, "tcm"),
                     KB_ERR_RANGE);
    assert_string_equal(eb.msg, "pe 5: offset 0x1200 of tcm");
    /* A new message replaces the old one entirely. */
    assert_int_equal(kb_err_set(&eb, KB_ERR_IO, "short"), KB_ERR_IO);
    assert_string_equal(eb.msg, "short");
}

static void test_err_set_truncates(void **state)
{
    kb_errbuf eb;
    char big[2000];

    (void)state;
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kb_err_set(&eb, KB_ERR_CONFIG, "%s", big);
    assert_int_equal(strlen(eb.msg), sizeof eb.msg - 1);
    assert_int_equal(eb.msg[0], 'a');
}

static void test_err_prefix(void **state)
{
    kb_errbuf eb;

    (void)state;
    kb_err_set(&eb, KB_ERR_CONFIG, "unknown key 'foo'");
    kb_err_prefix(&eb, "%s:%d", "machine.yaml", 12);
    assert_string_equal(eb.msg, "machine.yaml:12: unknown key 'foo'");
    kb_err_prefix(&eb, "loading");
    assert_string_equal(eb.msg, "loading: machine.yaml:12: unknown key 'foo'");
}

/* An out-of-memory message says how much and what for. */
static void test_err_nomem(void **state)
{
    kb_errbuf eb;

    (void)state;
    assert_int_equal(kb_err_nomem(&eb, 536870912ull, "%s read back", "the results"),
                     KB_ERR_NOMEM);
    assert_string_equal(eb.msg, "the results read back: 536870912 bytes (512.0 MiB) could not "
                                "be allocated");
    assert_int_equal(kb_err_nomem(NULL, 1, "dropped"), KB_ERR_NOMEM);
}

static void test_err_null_buffer(void **state)
{
    (void)state;
    assert_int_equal(kb_err_set(NULL, KB_ERR_NOTFOUND, "dropped %d", 1), KB_ERR_NOTFOUND);
    kb_err_prefix(NULL, "ignored %s", "too");
    assert_int_equal(kb_err_set(NULL, 0, "ok"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror_names),
        cmocka_unit_test(test_strerror_all_distinct),
        cmocka_unit_test(test_codes_stable),
        cmocka_unit_test(test_err_set_formats_and_returns_code),
        cmocka_unit_test(test_err_set_truncates),
        cmocka_unit_test(test_err_prefix),
        cmocka_unit_test(test_err_nomem),
        cmocka_unit_test(test_err_null_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
