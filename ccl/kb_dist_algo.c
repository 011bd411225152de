/*
 * kb_dist_algo — validator multi_pe_sip_local, the check the rank = SIP entries share
 * (kb_dist_algo.h). It lives apart from the process group (kb_dist.c) so the entries
 * (kb_ccl_algos.c, kb_ccl_intercube.c) call into no file that refers back to them.
 * Limits: checks placement and shape only, never the data.
 */
#include "kb_dist_algo.h"

int kb_dist_check_sip_local(kb_ctx *ctx, kb_tensor *const *t, int ws, int shards,
                            const char *what, const char *layout,
                            int (*shard_ok)(const kb_shard_spec *sh))
{
    kb_errbuf *eb = kb_ctx_err(ctx);
    for (int r = 0; r < ws; r++) {
        if (!t[r])
            return kb_err_set(eb, KB_ERR_INVAL, "%s: rank %d passed no tensor", what, r);
        if (kb_tensor_sip(t[r]) != (unsigned)r)
            return kb_err_set(eb, KB_ERR_STATE, "%s: validator multi_pe_sip_local: rank %d's "
                              "tensor '%s' lives on SIP %u (call set_device(rank) first)", what,
                              r, kb_tensor_name(t[r]), kb_tensor_sip(t[r]));
        if ((int)kb_tensor_nshards(t[r]) != shards || kb_tensor_rows(t[r]) != kb_tensor_rows(t[0]) || kb_tensor_cols(t[r]) != kb_tensor_cols(t[0]) ||
            kb_tensor_dtype(t[r]) != kb_tensor_dtype(t[0]))
            return kb_err_set(eb, KB_ERR_STATE, "%s: validator multi_pe_sip_local: rank %d's "
                              "tensor '%s' must be split into %d equal shards (%s) like rank 0's",
                              what, r, kb_tensor_name(t[r]), shards, layout);
        for (size_t i = 0; i < kb_tensor_nshards(t[r]); i++)
            if (kb_tensor_shard(t[r], i)->nbytes != kb_tensor_shard(t[r], 0)->nbytes ||
                (shard_ok && !shard_ok(kb_tensor_shard(t[r], i))))
                return kb_err_set(eb, KB_ERR_STATE, "%s: validator multi_pe_sip_local: uneven "
                                  "or misplaced shard %zu of rank %d", what, i, r);
    }
    return 0;
}
