/*
 * Fuzz target: the topology loader (configs/topology.yaml, kb_config_load_topology), then the
 * cross-field checks and the derived sizes a valid machine feeds the hardware model.
 */
#include "fuzz_util.h"

#include "kb_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kb_config cfg;
    kb_errbuf eb;
    int rc;

    if (size > KBF_MAX_INPUT)
        return 0;
    kb_config_defaults(&cfg);
    eb.msg[0] = '\0';
    rc = kb_config_load_topology(&cfg, kbf_file("topology.yaml", data, size), &eb);
    if (rc == 0)
        rc = kb_config_validate(&cfg, &eb);
    if (rc != 0) {
        KBF_CHECK_ERR(rc, eb);
    } else {
        const kb_topo_cfg *t = &cfg.topo;
        int w = 0, h = 0;
        kb_topo_noc_dims(t, &w, &h);
        /* a validated machine has a mesh that holds its PEs and a PE count that fits an int
         * the hardware model indexes PEs with */
        KBF_CHECK(w >= 1 && h >= 1, "noc dims %d x %d", w, h);
        KBF_CHECK(kb_topo_pes_per_cube(t) >= 1 && kb_topo_cubes_per_sip(t) >= 1 &&
                      kb_topo_total_pes(t) >= 1 &&
                      kb_topo_total_pes(t) / kb_topo_pes_per_cube(t) / kb_topo_cubes_per_sip(t)
                          == t->sips_count,
                  "PE counts %d x %d x %d", t->sips_count, kb_topo_cubes_per_sip(t),
                  kb_topo_pes_per_cube(t));
    }
    kb_config_fini(&cfg);
    return 0;
}
