/*
 * kb_addr — encoding, decoding and printing of the simulator's 51-bit physical addresses
 * (layout in kb_addr.h). Everything here is pure bit manipulation on uint64_t values, so it is
 * safe to call from any thread and never allocates. Factories refuse out-of-range arguments by
 * returning KB_PA_INVALID_ADDR instead of truncating, because a silently wrapped field would
 * alias another PE's memory; the decoder is strict for the same reason (reserved bits and the
 * reserved fourth PE range decode as KB_PA_INVALID). Limits: only the three named PE ranges
 * exist; the HBM window is not checked against the configured stack size (the allocators do
 * that).
 */
#include "kb_addr.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define RACK_SHIFT 47
#define SIP_SHIFT 43
#define CUBE_SHIFT 38
#define HBM_SEL_BIT (UINT64_C(1) << 37)
#define UNIT_SHIFT 34
#define PE_SHIFT 30
#define EXT_BIT (UINT64_C(1) << 29)
#define RANGE_SHIFT 27

#define MASK(bits) ((UINT64_C(1) << (bits)) - 1)

static const char *const range_names[KB_PE_NRANGES] = {"tcm", "ipcq", "scratch"};

const char *kb_pe_range_name(kb_pe_range r)
{
    if ((int)r < 0 || r >= KB_PE_NRANGES)
        return NULL;
    return range_names[r];
}

int kb_pe_range_from_name(const char *name)
{
    int i;

    if (!name)
        return -1;
    for (i = 0; i < (int)KB_PE_NRANGES; i++)
        if (strcmp(name, range_names[i]) == 0)
            return i;
    return -1;
}

/* The node part (rack, sip, cube) shared by every kind of address. */
static kb_pa node_bits(unsigned rack, unsigned sip, unsigned cube)
{
    return ((kb_pa)rack << RACK_SHIFT) | ((kb_pa)sip << SIP_SHIFT) | ((kb_pa)cube << CUBE_SHIFT);
}

static kb_pa resource(unsigned gsip, unsigned cube, kb_unit unit, unsigned pe, uint64_t sub)
{
    if (gsip >= KB_MAX_GSIPS || cube >= KB_MAX_CUBES || pe >= KB_MAX_PES ||
        sub >= KB_SUB_OFFSET_BYTES)
        return KB_PA_INVALID_ADDR;
    return node_bits(gsip / KB_SIPS_PER_RACK, gsip % KB_SIPS_PER_RACK, cube) |
           ((kb_pa)unit << UNIT_SHIFT) | ((kb_pa)pe << PE_SHIFT) | sub;
}

kb_pa kb_pa_hbm(unsigned gsip, unsigned cube, uint64_t offset)
{
    if (gsip >= KB_MAX_GSIPS || cube >= KB_MAX_CUBES || offset >= KB_HBM_WINDOW_BYTES)
        return KB_PA_INVALID_ADDR;
    return node_bits(gsip / KB_SIPS_PER_RACK, gsip % KB_SIPS_PER_RACK, cube) | HBM_SEL_BIT |
           offset;
}

kb_pa kb_pa_pe_hbm(unsigned gsip, unsigned cube, unsigned pe, uint64_t offset,
                   uint64_t slice_bytes)
{
    /* Bounding slice_bytes by the window first keeps pe * slice_bytes from overflowing. */
    if (pe >= KB_MAX_PES || slice_bytes == 0 || slice_bytes > KB_HBM_WINDOW_BYTES ||
        offset >= slice_bytes)
        return KB_PA_INVALID_ADDR;
    return kb_pa_hbm(gsip, cube, (uint64_t)pe * slice_bytes + offset);
}

kb_pa kb_pa_pe_range(unsigned gsip, unsigned cube, unsigned pe, kb_pe_range r, uint64_t offset)
{
    if ((int)r < 0 || r >= KB_PE_NRANGES || offset >= KB_PE_RANGE_BYTES)
        return KB_PA_INVALID_ADDR;
    return resource(gsip, cube, KB_UNIT_PE, pe, ((uint64_t)r << RANGE_SHIFT) | offset);
}

kb_pa kb_pa_pe_tcm(unsigned gsip, unsigned cube, unsigned pe, uint64_t offset)
{
    return kb_pa_pe_range(gsip, cube, pe, KB_PE_TCM, offset);
}

kb_pa kb_pa_pe_ipcq(unsigned gsip, unsigned cube, unsigned pe, uint64_t offset)
{
    return kb_pa_pe_range(gsip, cube, pe, KB_PE_IPCQ, offset);
}

kb_pa kb_pa_pe_scratch(unsigned gsip, unsigned cube, unsigned pe, uint64_t offset)
{
    return kb_pa_pe_range(gsip, cube, pe, KB_PE_SCRATCH, offset);
}

kb_pa kb_pa_cube_sram(unsigned gsip, unsigned cube, uint64_t offset)
{
    return resource(gsip, cube, KB_UNIT_SRAM, 0, offset);
}

kb_pa kb_pa_mcpu(unsigned gsip, unsigned cube, uint64_t offset)
{
    return resource(gsip, cube, KB_UNIT_MCPU, 0, offset);
}

kb_pa_fields kb_pa_decode(kb_pa pa)
{
    kb_pa_fields f;
    kb_pa_fields bad;
    uint64_t sub;
    unsigned unit;

    memset(&f, 0, sizeof f);
    memset(&bad, 0, sizeof bad);
    bad.kind = KB_PA_INVALID;
    if (pa > KB_PA_MAX)
        return bad;
    f.rack = (unsigned)((pa >> RACK_SHIFT) & MASK(4));
    f.sip = (unsigned)((pa >> SIP_SHIFT) & MASK(4));
    f.cube = (unsigned)((pa >> CUBE_SHIFT) & MASK(5));
    if (pa & HBM_SEL_BIT) {
        f.kind = KB_PA_HBM;
        f.offset = pa & MASK(37);
        return f;
    }
    if (pa & EXT_BIT)
        return bad;
    unit = (unsigned)((pa >> UNIT_SHIFT) & MASK(3));
    f.pe = (unsigned)((pa >> PE_SHIFT) & MASK(4));
    sub = pa & MASK(29);
    switch (unit) {
    case KB_UNIT_PE:
        if ((sub >> RANGE_SHIFT) >= KB_PE_NRANGES)
            return bad; /* the reserved quarter of the PE map */
        f.kind = KB_PA_PE_RES;
        f.range = (kb_pe_range)(sub >> RANGE_SHIFT);
        f.offset = sub & MASK(RANGE_SHIFT);
        return f;
    case KB_UNIT_MCPU:
    case KB_UNIT_SRAM:
        /* A non-zero pe id here would make two encodings name one byte. */
        if (f.pe != 0)
            return bad;
        f.kind = unit == KB_UNIT_MCPU ? KB_PA_MCPU : KB_PA_SRAM;
        f.offset = sub;
        return f;
    default:
        return bad;
    }
}

int kb_pa_valid(kb_pa pa)
{
    return kb_pa_decode(pa).kind != KB_PA_INVALID;
}

kb_pa kb_pa_encode(const kb_pa_fields *f)
{
    unsigned gsip;

    if (!f || f->rack >= KB_MAX_RACKS || f->sip >= KB_SIPS_PER_RACK)
        return KB_PA_INVALID_ADDR;
    gsip = f->rack * KB_SIPS_PER_RACK + f->sip;
    switch (f->kind) {
    case KB_PA_HBM:
        return kb_pa_hbm(gsip, f->cube, f->offset);
    case KB_PA_PE_RES:
        return kb_pa_pe_range(gsip, f->cube, f->pe, f->range, f->offset);
    case KB_PA_MCPU:
        return kb_pa_mcpu(gsip, f->cube, f->offset);
    case KB_PA_SRAM:
        return kb_pa_cube_sram(gsip, f->cube, f->offset);
    default:
        return KB_PA_INVALID_ADDR;
    }
}

char *kb_pa_format(kb_pa pa, char *buf, size_t n)
{
    kb_pa_fields f;
    char node[48];
    const char *what;

    if (!buf || n == 0)
        return buf;
    f = kb_pa_decode(pa);
    if (f.kind == KB_PA_INVALID) {
        snprintf(buf, n, "invalid(0x%" PRIx64 ")", pa);
        return buf;
    }
    if (f.rack != 0)
        snprintf(node, sizeof node, "rack=%u sip=%u cube=%u", f.rack, f.sip, f.cube);
    else
        snprintf(node, sizeof node, "sip=%u cube=%u", f.sip, f.cube);
    switch (f.kind) {
    case KB_PA_PE_RES:
        assert((unsigned)f.range < KB_PE_NRANGES); /* kb_pa_decode refuses the reserved one */
        snprintf(buf, n, "%s pe=%u %s+0x%" PRIx64, node, f.pe, range_names[f.range], f.offset);
        return buf;
    case KB_PA_HBM:
        what = "hbm";
        break;
    case KB_PA_MCPU:
        what = "mcpu";
        break;
    default:
        what = "sram";
        break;
    }
    snprintf(buf, n, "%s %s+0x%" PRIx64, node, what, f.offset);
    return buf;
}
