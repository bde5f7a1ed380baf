#include "common/thread_name.h"

#include <pthread.h>

#include <cstring>

namespace strata {

void NameThisThread(const char* name) {
  char text[16] = {};
  std::strncpy(text, name, sizeof(text) - 1);
  static_cast<void>(pthread_setname_np(pthread_self(), text));
}

}  // namespace strata
