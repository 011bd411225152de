/*
 * kb_addr — 51-bit physical addresses (PhysAddr) of the simulated machine.
 *
 *   [50:47] rack (4)   [46:43] sip (4)   [42:38] cube (5)   [37:0] local_offset (38)
 *   local_offset[37] = 1  HBM window: [36:0] = byte offset into the cube's HBM stack (128 GiB)
 *   local_offset[37] = 0  resource window:
 *        [36:34] unit type (KB_UNIT_PE | KB_UNIT_MCPU | KB_UNIT_SRAM)
 *        [33:30] pe id (PE unit; 0 for MCPU/SRAM)
 *        [29]    ext (reserved, must be 0)
 *        [28:0]  sub_offset (512 MiB)
 * For the PE unit, sub_offset is split into fixed named ranges (the range-based PE resource
 * map): tcm, ipcq, scratch, each KB_PE_RANGE_BYTES (128 MiB) long; the remaining quarter is
 * reserved for future ranges. Decoding tells the range and the offset inside it. The SRAM
 * unit's sub_offset is a byte offset into the cube's SRAM.
 *
 * A "global SIP index" g (0..255) is stored as rack = g / 16, sip = g % 16; kb_pa_gsip()
 * recovers it. Addresses are plain uint64_t values; all functions here are pure.
 */
#ifndef KB_ADDR_H
#define KB_ADDR_H

#include <stddef.h>
#include <stdint.h>

#include "kbcl_runtime.h" /* kb_pa */

#define KB_PA_BITS 51
#define KB_PA_MAX ((UINT64_C(1) << KB_PA_BITS) - 1)
#define KB_HBM_WINDOW_BYTES (UINT64_C(1) << 37)  /* 128 GiB per cube */
#define KB_SUB_OFFSET_BYTES (UINT64_C(1) << 29)  /* 512 MiB per unit */
#define KB_PE_RANGE_BYTES (UINT64_C(1) << 27)    /* 128 MiB per named PE range */
#define KB_MAX_RACKS 16
#define KB_SIPS_PER_RACK 16
#define KB_MAX_GSIPS (KB_MAX_RACKS * KB_SIPS_PER_RACK)
#define KB_MAX_CUBES 32
#define KB_MAX_PES 16

typedef enum kb_unit { KB_UNIT_PE = 0, KB_UNIT_MCPU = 1, KB_UNIT_SRAM = 2 } kb_unit;

typedef enum kb_pe_range {
    KB_PE_TCM = 0,
    KB_PE_IPCQ = 1,
    KB_PE_SCRATCH = 2,
    KB_PE_NRANGES
} kb_pe_range;

/* What an address decodes to. */
typedef enum kb_pa_kind {
    KB_PA_HBM = 0,      /* cube HBM window: offset = byte offset in the stack */
    KB_PA_PE_RES = 1,   /* PE resource: range + offset inside the range */
    KB_PA_MCPU = 2,     /* M_CPU resource window: offset = sub_offset */
    KB_PA_SRAM = 3,     /* cube SRAM: offset = byte offset */
    KB_PA_INVALID = 4
} kb_pa_kind;

typedef struct kb_pa_fields {
    unsigned rack, sip, cube;  /* sip is the in-rack SIP (0..15) */
    kb_pa_kind kind;
    unsigned pe;               /* KB_PA_PE_RES only */
    kb_pe_range range;         /* KB_PA_PE_RES only */
    uint64_t offset;           /* see kb_pa_kind */
} kb_pa_fields;

/* Name of a PE range ("tcm", "ipcq", "scratch"); NULL when out of range. */
const char *kb_pe_range_name(kb_pe_range r);
/* Lookup by name; returns -1 when unknown. */
int kb_pe_range_from_name(const char *name);

/*
 * Factories. gsip is the global SIP index (rack*16 + sip). Arguments out of range (gsip >= 256,
 * cube >= 32, pe >= 16, offset past its window/range) give KB_PA_INVALID_ADDR, which decodes
 * as KB_PA_INVALID; callers validate with kb_pa_valid().
 */
#define KB_PA_INVALID_ADDR UINT64_MAX
kb_pa kb_pa_hbm(unsigned gsip, unsigned cube, uint64_t offset);
/* PE-local HBM slice: cube HBM offset = pe * slice_bytes + offset (offset < slice_bytes). */
kb_pa kb_pa_pe_hbm(unsigned gsip, unsigned cube, unsigned pe, uint64_t offset,
                   uint64_t slice_bytes);
kb_pa kb_pa_pe_range(unsigned gsip, unsigned cube, unsigned pe, kb_pe_range r, uint64_t offset);
kb_pa kb_pa_pe_tcm(unsigned gsip, unsigned cube, unsigned pe, uint64_t offset);
kb_pa kb_pa_pe_ipcq(unsigned gsip, unsigned cube, unsigned pe, uint64_t offset);
kb_pa kb_pa_pe_scratch(unsigned gsip, unsigned cube, unsigned pe, uint64_t offset);
kb_pa kb_pa_cube_sram(unsigned gsip, unsigned cube, uint64_t offset);
kb_pa kb_pa_mcpu(unsigned gsip, unsigned cube, uint64_t offset);

int kb_pa_valid(kb_pa pa);
/* Decodes any address; invalid ones (over 51 bits, ext bit set, bad unit, reserved range)
 * give kind KB_PA_INVALID. */
kb_pa_fields kb_pa_decode(kb_pa pa);
/* Inverse of kb_pa_decode for valid fields; KB_PA_INVALID_ADDR otherwise. */
kb_pa kb_pa_encode(const kb_pa_fields *f);

static inline unsigned kb_pa_gsip(kb_pa pa)
{
    return (unsigned)((pa >> 43) & 0xffu); /* rack:sip is contiguous => rack*16 + sip */
}
static inline unsigned kb_pa_cube(kb_pa pa) { return (unsigned)((pa >> 38) & 0x1fu); }

/*
 * Field extraction for hot paths (routes, operand checks). They do not validate: use them on
 * addresses kbcl produced, or after kb_pa_valid().
 */
static inline int kb_pa_is_hbm(kb_pa pa) { return (int)((pa >> 37) & 1u); }
static inline uint64_t kb_pa_hbm_offset(kb_pa pa) { return pa & ((UINT64_C(1) << 37) - 1); }
static inline unsigned kb_pa_unit_of(kb_pa pa) { return (unsigned)((pa >> 34) & 7u); }
static inline unsigned kb_pa_pe_of(kb_pa pa) { return (unsigned)((pa >> 30) & 15u); }
/* The bits [50:30] every address of a PE's resource window shares (rack, sip, cube, unit PE,
 * pe id); an address is in that PE's window iff (pa >> 30) equals this and bit 29 is clear. */
static inline uint64_t kb_pa_pe_window(unsigned gsip, unsigned cube, unsigned pe)
{
    return ((uint64_t)gsip << 13) | ((uint64_t)cube << 8) | ((uint64_t)KB_UNIT_PE << 4) | pe;
}
static inline int kb_pa_in_pe_window(kb_pa pa, uint64_t window)
{
    return (pa >> 30) == window && !((pa >> 29) & 1u);
}

/*
 * Readable form, e.g. "sip=1 cube=3 pe=5 ipcq+0x1200", "sip=0 cube=2 hbm+0x40000000",
 * "rack=1 sip=2 cube=0 sram+0x100" (rack is shown only when non-zero), "invalid(0x...)".
 * Writes at most n bytes including the NUL; returns buf.
 */
char *kb_pa_format(kb_pa pa, char *buf, size_t n);

#endif
