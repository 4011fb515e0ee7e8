/* The C entry point jaxlib loads for the trn2 PJRT plugin.

   jaxlib dlopens this library and calls GetPjrtApi(); the PJRT_Api table it returns is
   made and filled in Python (jax_trn2.plugin.table), which hands its address to
   trn2_set_api() before registering the plugin. trn2_noop() is what every slot points at
   once Python is finalising (jax_trn2.plugin.table.retire): jaxlib's destructors may still
   call PJRT_Client_Destroy and PJRT_Buffer_Destroy then, after ctypes has freed its
   callbacks. It returns NULL, PJRT's "no error". No Python headers are needed.

   The slots below are the getters jaxlib calls several times for every buffer of every
   call (a program on 64 devices makes 64 buffers per result), and on every call of an
   executable (its counts): through ctypes each would take the GIL and cost microseconds.
   They read the record a PJRT pointer points at, which Python fills
   (jax_trn2.plugin.handles.Record), and write the args struct's first out-fields, which
   follow the object's pointer in every one of them (checked against PJRT's layouts by
   tests/jax_trn2/plugin/test_abi.py). Every event is the one ready
   event: the simulator finishes its work, or fails, before a call returns. */

#include <fenv.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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
  size_t num_replicas, num_partitions, num_outputs;  /* an executable's */
  const void *memory_layout;  /* a buffer's: its trn2_layout */
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

// The bool fields PJRT's args have where `out` starts: written byte-wise (memcpy), as
// writing a bool through a pointer to void * would break C's aliasing rules.
static void write_bool(trn2_args *args, bool value) {
  memcpy(&args->out[0], &value, sizeof value);
}

void *trn2_Event_IsReady(trn2_args *args) {
  write_bool(args, true);
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
  write_bool(args, args->object->deleted);
  return 0;
}

/* An executable's counts, which jaxlib reads on every call of it. */
static void write_size(trn2_args *args, size_t value) {
  memcpy(&args->out[0], &value, sizeof value);
}

void *trn2_Executable_NumReplicas(trn2_args *args) {
  write_size(args, args->object->num_replicas);
  return 0;
}

void *trn2_Executable_NumPartitions(trn2_args *args) {
  write_size(args, args->object->num_partitions);
  return 0;
}

void *trn2_Executable_NumOutputs(trn2_args *args) {
  write_size(args, args->object->num_outputs);
  return 0;
}

/* Python slots the shim calls in a clean state (table.GUARDED_SLOTS):
   - Python's pending exception set aside: jaxlib destroys a buffer or an executable when
     Python frees the jax object holding it, which Python may do while an exception is on
     its way out (the arguments of a call that raised); a ctypes callback run then would
     swallow it ("SystemError: error return without exception set").
   - the default floating-point environment: jaxlib compiles on threads that flush
     subnormal numbers to zero, and the simulator's compile reads constants and folds them
     with numpy, which would flush them too.
   The shim is loaded into the Python process, whose C API it calls (PyGILState_STATE is
   an int enum). */
extern int PyGILState_Ensure(void);
extern void PyGILState_Release(int state);
extern void *PyGILState_GetThisThreadState(void);
extern void PyErr_Fetch(void **type, void **value, void **traceback);
extern void PyErr_Restore(void *type, void *value, void *traceback);
extern int Py_AddPendingCall(int (*function)(void *), void *arg);

static void *call_python(void *(*function)(void *), void *args) {
  fenv_t caller_fp;
  fegetenv(&caller_fp);
  fesetenv(FE_DFL_ENV);
  int gil = PyGILState_Ensure();
  void *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  void *error = function(args);
  PyErr_Restore(type, value, traceback);
  PyGILState_Release(gil);
  fesetenv(&caller_fp);
  return error;
}

#define SETTER(name)                                   \
  static void *(*python_##name)(void *) = 0;           \
  void trn2_set_##name(void *(*function)(void *)) { python_##name = function; }

SETTER(Error_Destroy)

/* Destroys jaxlib calls on its own threads are deferred to Python's main thread, never
   made there: such a thread (one Python has no state for) may be waiting for the GIL when
   Python starts to finalise, and Python then ends it with pthread_exit, whose unwinding
   through jaxlib's noexcept destructors aborts the process ("terminate called without an
   active exception"; a compile's promise, freed on jaxlib's thread pool, holds the last
   reference to the executable of a program that finished before it). A destroy only
   frees, so running it a moment later is safe. The deferred ones wait on a lock-free list,
   in call order, run by the main thread (Py_AddPendingCall) or by the next destroy made
   on a thread Python knows, whichever comes first; once retired (trn2_retire, at exit)
   they are dropped. (The compiles still take the GIL on jaxlib's threads: jaxlib waits
   for them, so none is under way when Python finalises.) */
typedef struct deferred {
  void *(*function)(void *);
  void *object;
  struct deferred *next;
} deferred;

static _Atomic(deferred *) deferred_destroys = 0;
static atomic_bool drain_scheduled = false;  /* a pending call to run_deferred is queued */
static atomic_bool retired = false;

void trn2_retire(void) { atomic_store(&retired, true); }

/* The destroy `function` of the object at `object`, as jaxlib would have called it; an
   error it returns destroyed in turn (nobody else will read it). */
static void run_destroy(void *(*function)(void *), void *object) {
  trn2_args args = {offsetof(trn2_args, out), 0, object, {0, 0}};  /* header, object */
  void *error = call_python(function, &args);
  if (error) {
    trn2_args error_args = {offsetof(trn2_args, out), 0, error, {0, 0}};
    call_python(python_Error_Destroy, &error_args);
  }
}

static void run_deferred(void) {
  deferred *newest = atomic_exchange(&deferred_destroys, (deferred *)0), *oldest = 0;
  while (newest) {  /* the list reversed: oldest first */
    deferred *next = newest->next;
    newest->next = oldest;
    oldest = newest;
    newest = next;
  }
  while (oldest) {
    deferred *item = oldest;
    oldest = item->next;
    if (!atomic_load(&retired)) run_destroy(item->function, item->object);
    free(item);
  }
}

static int scheduled_drain(void *unused) {  /* Py_AddPendingCall's */
  (void)unused;
  atomic_store(&drain_scheduled, false);
  run_deferred();
  return 0;
}

static void *destroy(void *(*function)(void *), trn2_args *args) {
  if (PyGILState_GetThisThreadState()) {
    if (atomic_load(&deferred_destroys)) run_deferred();
    return call_python(function, args);
  }
  if (atomic_load(&retired)) return 0;  /* Python is finalising: nothing is freed now */
  deferred *item = malloc(sizeof *item);
  if (!item) return 0;  /* out of memory: the object stays allocated until exit */
  item->function = function;
  item->object = args->object;
  item->next = atomic_load(&deferred_destroys);
  while (!atomic_compare_exchange_weak(&deferred_destroys, &item->next, item)) {
  }
  /* Python's queue of pending calls is short (32): one drain queued at a time, and one
     that could not be queued is tried again at the next deferred destroy */
  if (!atomic_exchange(&drain_scheduled, true) && Py_AddPendingCall(scheduled_drain, 0)) {
    atomic_store(&drain_scheduled, false);
  }
  return 0;
}

#define GUARDED(name) \
  SETTER(name)        \
  void *trn2_##name(void *args) { return call_python(python_##name, args); }

#define DESTROY(name) \
  SETTER(name)        \
  void *trn2_##name(trn2_args *args) { return destroy(python_##name, args); }

DESTROY(Buffer_Destroy)
DESTROY(Executable_Destroy)
DESTROY(LoadedExecutable_Destroy)
DESTROY(Client_Destroy)
GUARDED(Client_Compile)
GUARDED(Executable_DeserializeAndLoad)

/* jaxlib destroys the NULL "error" of every successful call it checks (64 per result of a
   program on 64 devices); a real error is Python's to destroy. */
void *trn2_Error_Destroy(trn2_args *args) {
  return args->object ? destroy(python_Error_Destroy, args) : 0;
}

void *trn2_Memory_Kind(trn2_args *args) {
  args->out[0] = (void *)args->object->kind;
  args->out[1] = (void *)args->object->kind_size;
  return 0;
}

/* PJRT's layouts extension (jax_trn2.plugin.memory_layouts): a PJRT_Layouts_MemoryLayout is a
   trn2_layout, one per layout, which lives as long as the process (nothing to destroy);
   serialized, it is XLA's text of the layout. */
typedef struct {
  const char *text;
  size_t size;
} trn2_layout;

void *trn2_Layouts_PJRT_Buffer_MemoryLayout(trn2_args *args) {
  args->out[0] = (void *)args->object->memory_layout;
  return 0;
}

void *trn2_Layouts_MemoryLayout_Destroy(trn2_args *args) { (void)args; return 0; }

static void keep_serialized(void *serialized) { (void)serialized; }

/* PJRT_Layouts_MemoryLayout_Serialize_Args: the header, the layout, then its out-fields. */
typedef struct {
  size_t struct_size;
  void *extension_start;
  const trn2_layout *layout;
  const char *serialized_bytes;
  size_t serialized_bytes_size;
  const void *serialized_layout;
  void (*serialized_layout_deleter)(void *);
} trn2_serialize_args;

void *trn2_Layouts_MemoryLayout_Serialize(trn2_serialize_args *args) {
  args->serialized_bytes = args->layout->text;
  args->serialized_bytes_size = args->layout->size;
  args->serialized_layout = args->layout;
  args->serialized_layout_deleter = keep_serialized;
  return 0;
}
