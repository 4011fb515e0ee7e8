/* The C entry point jaxlib loads for the trn2 PJRT plugin.

   jaxlib dlopens this library and calls GetPjrtApi(); the PJRT_Api table it returns is
   made and filled in Python (jax_trn2.plugin.table), which hands its address to
   trn2_set_api() before registering the plugin. trn2_noop() is what every slot points at
   once Python is finalising (jax_trn2.plugin.table.retire): jaxlib's destructors may still
   call PJRT_Client_Destroy and PJRT_Buffer_Destroy then, after ctypes has freed its
   callbacks. It returns NULL, PJRT's "no error". No Python headers are needed.

   The slots below are the getters jaxlib calls several times for every buffer of every
   call (a program on 64 devices makes 64 buffers per result): through ctypes each would
   take the GIL and cost microseconds. They read the record a PJRT pointer points at,
   which Python fills (jax_trn2.plugin.handles.Record), and write the args struct's first
   out-fields, which follow the object's pointer in every one of them (checked against
   PJRT's layouts by tests/jax_trn2/plugin/test_abi.py). Every event is the one ready
   event: the simulator finishes its work, or fails, before a call returns. */

#include <stdbool.h>
#include <stddef.h>

static const void *api_table = 0;

void trn2_set_api(const void *table) { api_table = table; }

const void *GetPjrtApi(void) { return api_table; }

void *trn2_noop(void *args) {
  (void)args;
  return 0;
}

/* What a PJRT pointer points at (handles.Record): the function table PJRT_Memory and
   PJRT_Error begin with, then what the getters below read. */
typedef struct {
  const void *vtable;
  void *device;      /* a buffer's PJRT_Device */
  void *memory;      /* a buffer's PJRT_Memory */
  const char *kind;  /* a memory's kind */
  size_t kind_size;
  bool deleted;      /* a buffer's */
} trn2_record;

/* PJRT_<Object>_<Getter>_Args: the header, the object, then its out-fields. */
typedef struct {
  size_t struct_size;
  void *extension_start;
  trn2_record *object;
  void *out[2];
} trn2_args;

static trn2_record ready_event;

void *trn2_ready_event(void) { return &ready_event; }

void *trn2_Event_Destroy(trn2_args *args) { (void)args; return 0; }

void *trn2_Event_IsReady(trn2_args *args) {
  *(bool *)&args->out[0] = true;
  return 0;
}

void *trn2_Event_Error(trn2_args *args) { (void)args; return 0; }

void *trn2_Event_Await(trn2_args *args) { (void)args; return 0; }

void *trn2_Event_OnReady(trn2_args *args) {
  void (*callback)(void *error, void *user_arg) = (void (*)(void *, void *))args->out[0];
  callback(0, args->out[1]);
  return 0;
}

void *trn2_Buffer_ReadyEvent(trn2_args *args) {
  args->out[0] = &ready_event;
  return 0;
}

void *trn2_Buffer_Device(trn2_args *args) {
  args->out[0] = args->object->device;
  return 0;
}

void *trn2_Buffer_Memory(trn2_args *args) {
  args->out[0] = args->object->memory;
  return 0;
}

void *trn2_Buffer_IsDeleted(trn2_args *args) {
  *(bool *)&args->out[0] = args->object->deleted;
  return 0;
}

/* jaxlib destroys the NULL "error" of every successful call it checks (64 per result of a
   program on 64 devices); a real error is Python's to destroy. */
static void *(*destroy_error)(trn2_args *) = 0;

void trn2_set_error_destroy(void *(*destroy)(trn2_args *)) { destroy_error = destroy; }

void *trn2_Error_Destroy(trn2_args *args) {
  return args->object ? destroy_error(args) : 0;
}

void *trn2_Memory_Kind(trn2_args *args) {
  args->out[0] = (void *)args->object->kind;
  args->out[1] = (void *)args->object->kind_size;
  return 0;
}
