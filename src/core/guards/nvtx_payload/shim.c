/*
 * boundscope's C side of NVTX's payload extension: registers the schema of the structured
 * payload that boundscope's ranges carry (see `nvtx_payload.rs`, `DetailsBlock`).
 *
 * The extension's implementation is header-only: including `nvToolsExtPayload.h` compiles its
 * loader into this file. Its globals are link-once, so other copies in the program merge.
 */
#include <stddef.h>
#include <stdint.h>

#include "nvtx3/nvToolsExtPayload.h"

/* Lengths of the embedded strings, in bytes, NUL included. Must match `nvtx_payload.rs`. */
#define BOUNDSCOPE_INPUTS_LEN 160
#define BOUNDSCOPE_OUTPUTS_LEN 96

typedef struct boundscope_details_t {
    uint64_t plan;
    uint64_t first_step;
    uint64_t steps;
    uint64_t ops;
    uint64_t bytes_read;
    uint64_t bytes_written;
    uint64_t flops;
    char inputs[BOUNDSCOPE_INPUTS_LEN];
    char outputs[BOUNDSCOPE_OUTPUTS_LEN];
} boundscope_details_t;

/* The layout both sides must agree on: size, then the offset of each field in order. */
void boundscope_details_layout(uint64_t* out, size_t count)
{
    const uint64_t layout[] = {
        sizeof(boundscope_details_t),
        offsetof(boundscope_details_t, plan),
        offsetof(boundscope_details_t, first_step),
        offsetof(boundscope_details_t, steps),
        offsetof(boundscope_details_t, ops),
        offsetof(boundscope_details_t, bytes_read),
        offsetof(boundscope_details_t, bytes_written),
        offsetof(boundscope_details_t, flops),
        offsetof(boundscope_details_t, inputs),
        offsetof(boundscope_details_t, outputs),
    };
    size_t i;
    for (i = 0; i < count && i < sizeof(layout) / sizeof(layout[0]); ++i) {
        out[i] = layout[i];
    }
}

#define ENTRY_U64(field, desc)                                                                 \
    { 0, NVTX_PAYLOAD_ENTRY_TYPE_UINT64, #field, desc, 0,                                      \
      offsetof(boundscope_details_t, field), NULL, NULL }
#define ENTRY_STR(field, len, desc)                                                            \
    { 0, NVTX_PAYLOAD_ENTRY_TYPE_CSTRING, #field, desc, len,                                   \
      offsetof(boundscope_details_t, field), NULL, NULL }

static const nvtxPayloadSchemaEntry_t boundscope_details_entries[] = {
    ENTRY_U64(plan, "the plan's id (Plan::id)"),
    ENTRY_U64(first_step, "the first compiled step the range surrounds"),
    ENTRY_U64(steps, "how many compiled steps the range surrounds"),
    ENTRY_U64(ops, "how many ops the range surrounds (fused ops count one each)"),
    ENTRY_U64(bytes_read, "bytes of the tensors it reads"),
    ENTRY_U64(bytes_written, "bytes of the tensors it writes"),
    ENTRY_U64(flops, "an estimate of its floating-point operations"),
    ENTRY_STR(inputs, BOUNDSCOPE_INPUTS_LEN, "dtypes and shapes of the tensors it reads"),
    ENTRY_STR(outputs, BOUNDSCOPE_OUTPUTS_LEN, "dtypes and shapes of the tensors it writes"),
};

/*
 * Registers the schema in `domain` with the static id `schema_id`. Returns the id the tool
 * gives it, or 0 when no tool is attached or the tool does not take payload schemas.
 */
uint64_t boundscope_register_details_schema(nvtxDomainHandle_t domain, uint64_t schema_id)
{
    nvtxPayloadSchemaAttr_t attr;
    attr.fieldMask = NVTX_PAYLOAD_SCHEMA_ATTR_FIELD_NAME | NVTX_PAYLOAD_SCHEMA_ATTR_FIELD_TYPE
                     | NVTX_PAYLOAD_SCHEMA_ATTR_FIELD_ENTRIES
                     | NVTX_PAYLOAD_SCHEMA_ATTR_FIELD_NUM_ENTRIES
                     | NVTX_PAYLOAD_SCHEMA_ATTR_FIELD_STATIC_SIZE
                     | NVTX_PAYLOAD_SCHEMA_ATTR_FIELD_SCHEMA_ID;
    attr.name = "boundscope range";
    attr.type = NVTX_PAYLOAD_SCHEMA_TYPE_STATIC;
    attr.flags = NVTX_PAYLOAD_SCHEMA_FLAG_NONE;
    attr.entries = boundscope_details_entries;
    attr.numEntries = sizeof(boundscope_details_entries) / sizeof(boundscope_details_entries[0]);
    attr.payloadStaticSize = sizeof(boundscope_details_t);
    attr.packAlign = 0;
    attr.schemaId = schema_id;
    attr.extension = NULL;
    return nvtxPayloadSchemaRegister(domain, &attr);
}
