/*
 * kb_schema — typed key tables for configuration files: the topology's (here) and, through the
 * same types and KB_SCHEMA_* builders, those of the layers above (ccl/kb_ccl_config.c).
 *
 * A scope is the set of keys that may appear inside one YAML section, with byte offsets into
 * the struct that section fills: the topology file (kb_topo_cfg) here; ccl.yaml's `defaults`
 * and its `algorithms` entries in ccl/. A scope may stack a second table at an offset (an
 * entry's overrides of the defaults), minus one `skip`ped key. Keys are dotted paths relative
 * to their scope; a "section" is any proper prefix of a key path. All tables are const;
 * nothing here allocates.
 */
#ifndef KB_SCHEMA_H
#define KB_SCHEMA_H

#include <stddef.h>

#include "kb_err.h"

typedef enum kb_schema_type {
    KB_ST_INT,    /* int */
    KB_ST_INT64,  /* int64_t */
    KB_ST_U64,    /* uint64_t */
    KB_ST_DOUBLE, /* double; integers are accepted */
    KB_ST_BOOL,   /* int 0/1 */
    KB_ST_STRING, /* char[size], identifier-like */
    KB_ST_ENUM    /* char[size], one of `allowed` */
} kb_schema_type;

typedef struct kb_schema_key {
    const char *path;            /* dotted, relative to the scope */
    kb_schema_type type;
    size_t off;                  /* offset into the scope's struct */
    size_t size;                 /* capacity of string fields */
    const char *dflt;            /* default as text (what kb_config_defaults parses) */
    double lo, hi;               /* inclusive range for numbers */
    int lo_open;                 /* 1: the lower bound is exclusive (> lo) */
    const char *const *allowed;  /* NULL-terminated, KB_ST_ENUM only */
    const char *doc;             /* one line, with the unit */
} kb_schema_key;

typedef struct kb_schema_scope {
    const char *prefix;          /* prefix of full paths in messages and listings */
    const kb_schema_key *tab[2]; /* tab[1] may be NULL */
    size_t n[2];
    size_t adj[2];               /* added to a tab[i] key's offset */
    const char *skip;            /* a tab[1] path this scope does not have */
} kb_schema_scope;

extern const kb_schema_scope kb_schema_topo;         /* over kb_topo_cfg */

/* Key builders for a scope's table; T is the struct the scope fills, p the key's path, f the
 * field, d the default as text, l/h the inclusive range, doc one line with the unit. */
#define KB_SCHEMA_FSIZE(T, f) sizeof(((T *)0)->f)
#define KB_SCHEMA_KEY(T, p, ty, f, sz, d, l, h, open, al, doc) \
    { (p), (ty), offsetof(T, f), (sz), (d), (l), (h), (open), (al), (doc) }
#define KB_SCHEMA_INT(T, p, f, d, l, h, doc) \
    KB_SCHEMA_KEY(T, p, KB_ST_INT, f, 0, d, l, h, 0, NULL, doc)
#define KB_SCHEMA_I64(T, p, f, d, l, h, doc) \
    KB_SCHEMA_KEY(T, p, KB_ST_INT64, f, 0, d, l, h, 0, NULL, doc)
#define KB_SCHEMA_U64(T, p, f, d, l, h, doc) \
    KB_SCHEMA_KEY(T, p, KB_ST_U64, f, 0, d, l, h, 0, NULL, doc)
#define KB_SCHEMA_DBL(T, p, f, d, l, h, doc) \
    KB_SCHEMA_KEY(T, p, KB_ST_DOUBLE, f, 0, d, l, h, 0, NULL, doc)
#define KB_SCHEMA_POS(T, p, f, d, h, doc) /* > 0 */ \
    KB_SCHEMA_KEY(T, p, KB_ST_DOUBLE, f, 0, d, 0.0, h, 1, NULL, doc)
#define KB_SCHEMA_BOOL(T, p, f, d, doc) \
    KB_SCHEMA_KEY(T, p, KB_ST_BOOL, f, 0, d, 0.0, 1.0, 0, NULL, doc)
#define KB_SCHEMA_STR(T, p, f, d, doc) \
    KB_SCHEMA_KEY(T, p, KB_ST_STRING, f, KB_SCHEMA_FSIZE(T, f), d, 0.0, 0.0, 0, NULL, doc)
#define KB_SCHEMA_ENUM(T, p, f, d, al, doc) \
    KB_SCHEMA_KEY(T, p, KB_ST_ENUM, f, KB_SCHEMA_FSIZE(T, f), d, 0.0, 0.0, 0, al, doc)
/* Number of entries of a key table. */
#define KB_SCHEMA_NKEYS(a) (sizeof(a) / sizeof((a)[0]))

/* SIP-level topology names of system.sips.topology (NULL-terminated). */
extern const char *const kb_schema_sip_topologies[];
extern const char *const kb_schema_noc_topologies[]; /* cube.noc.topology: mesh crossbar bus */
extern const char *const kb_schema_switch_arbitrations[]; /* system.switch.arbitration */
extern const char *const kb_schema_io_completions[];      /* sip.io_cpu.completions */

/* The idx-th key of a scope in table order (NULL past the end); *off gets its offset. */
const kb_schema_key *kb_schema_at(const kb_schema_scope *sc, size_t idx, size_t *off);
/* The key with this relative path, or NULL. */
const kb_schema_key *kb_schema_find(const kb_schema_scope *sc, const char *rel, size_t *off);
/* 1 when rel ("" = the scope's root) is a proper prefix of some key path. */
int kb_schema_is_section(const kb_schema_scope *sc, const char *rel);
/* Writes the distinct next path components under section rel as "a, b, c" into buf. */
void kb_schema_children(const kb_schema_scope *sc, const char *rel, char *buf, size_t cap);
/* Type name for listings ("int", "double", "enum: a|b" ...) written into buf. */
void kb_schema_type_text(const kb_schema_key *k, char *buf, size_t cap);
/* A number key's whole range as its messages state it: "[1, 256]", "[0.001, 1e6]", "(0, 64]"
 * (an exclusive lower bound), written into buf (cap >= 64); returns buf. */
const char *kb_schema_range_text(const kb_schema_key *k, char *buf, size_t cap);
/* A double as those messages write it: the shortest text that reads back as v, with a plain
 * exponent ("1e6", "1e-5", "0.001"); written into buf (cap >= 32); returns buf. */
const char *kb_schema_num_text(double v, char *buf, size_t cap);

/*
 * Parses `text` (a YAML scalar; quoted = it was written in quotes, so it is a string) as the
 * value of key k and stores it at dst. full is the key's full dotted path, for messages. On
 * failure dst is untouched and KB_ERR_CONFIG is returned with a message without location.
 */
int kb_schema_parse(const kb_schema_key *k, const char *full, const char *text, int quoted,
                    void *dst, kb_errbuf *eb);

/* Stores every key's default into the struct at base. */
void kb_schema_apply_defaults(const kb_schema_scope *sc, void *base);

#endif
