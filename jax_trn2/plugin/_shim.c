/* The C entry point jaxlib loads for the trn2 PJRT plugin.

   jaxlib dlopens this library and calls GetPjrtApi(); the PJRT_Api table it returns is
   made and filled in Python (jax_trn2.plugin.table), which hands its address to
   trn2_set_api() before registering the plugin. trn2_noop() is what every slot points at
   once Python is finalising (jax_trn2.plugin.table.retire): jaxlib's destructors may still
   call PJRT_Client_Destroy and PJRT_Buffer_Destroy then, after ctypes has freed its
   callbacks. It returns NULL, PJRT's "no error". No Python headers are needed. */

static const void *api_table = 0;

void trn2_set_api(const void *table) { api_table = table; }

const void *GetPjrtApi(void) { return api_table; }

void *trn2_noop(void *args) {
  (void)args;
  return 0;
}
