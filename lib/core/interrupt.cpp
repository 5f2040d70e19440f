#include "core/interrupt.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace sq {

namespace {

// Slot states: a slot is claimed (kFree -> kWriting) by compare-exchange, filled, then published
// (kReady, release). The handler reads only kReady slots (acquire), so it never sees a half-copied
// path. Lock-free std::atomic<int> is async-signal-safe.
// kReadyDir marks a published directory slot.
enum : int { kFree = 0, kWriting = 1, kReady = 2, kReadyDir = 3 };
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

std::atomic<int> g_state[kMaxTempFiles];
char g_paths[kMaxTempFiles][kMaxTempPathBytes];
char g_tool[64] = "sqkit";

// Appends `s` to buf[*n..cap) (async-signal-safe; no allocation, no locale).
void append(char* buf, size_t cap, size_t* n, const char* s) {
  while (*s && *n + 1 < cap) buf[(*n)++] = *s++;
}

void append_uint(char* buf, size_t cap, size_t* n, unsigned v) {
  char digits[16];
  int k = 0;
  do {
    digits[k++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v && k < 16);
  while (k > 0 && *n + 1 < cap) buf[(*n)++] = digits[--k];
}

/// Unlinks every entry of directory `path` but "." and "..", then removes the directory; returns the
/// number of entries and directories removed. Only system calls (open, getdents64, unlinkat, close,
/// rmdir) and a stack buffer: async-signal-safe, unlike opendir()/readdir(), which may allocate.
unsigned remove_directory_signal_safe(const char* path) {
  unsigned removed = 0;
  const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    alignas(8) char buf[4096];
    for (;;) {
      const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        // struct linux_dirent64: u64 d_ino, s64 d_off, u16 d_reclen, u8 d_type, char d_name[].
        unsigned short reclen = 0;
        std::memcpy(&reclen, buf + off + 16, sizeof reclen);
        const char* name = buf + off + 19;
        const bool dot = name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
        if (!dot && ::unlinkat(fd, name, 0) == 0) ++removed;
        if (reclen == 0) break;
        off += reclen;
      }
    }
    ::close(fd);
  }
  if (::rmdir(path) == 0) ++removed;
  return removed;
}

extern "C" void on_interrupt(int signo) {
  unsigned removed = 0;
  for (int i = 0; i < kMaxTempFiles; ++i)  // files first: a writer's temporary may sit in a registered directory
    if (g_state[i].load(std::memory_order_acquire) == kReady && ::unlink(g_paths[i]) == 0) ++removed;
  for (int i = 0; i < kMaxTempFiles; ++i)
    if (g_state[i].load(std::memory_order_acquire) == kReadyDir) removed += remove_directory_signal_safe(g_paths[i]);
  char msg[192];
  size_t n = 0;
  append(msg, sizeof msg, &n, "\n");
  append(msg, sizeof msg, &n, g_tool);
  append(msg, sizeof msg, &n, signo == SIGINT ? ": interrupted by SIGINT" : signo == SIGTERM ? ": interrupted by SIGTERM" : ": interrupted");
  append(msg, sizeof msg, &n, "; removed ");
  append_uint(msg, sizeof msg, &n, removed);
  append(msg, sizeof msg, &n, " temporary file(s)\n");
  ssize_t ignored = ::write(STDERR_FILENO, msg, n);
  (void)ignored;
  ::_exit(128 + signo);
}

}  // namespace

namespace {
int register_path(const char* path, int ready_state) noexcept {
  if (!path) return -1;
  const size_t len = std::strlen(path);
  if (len == 0 || len >= kMaxTempPathBytes) return -1;
  for (int i = 0; i < kMaxTempFiles; ++i) {
    int expected = kFree;
    if (g_state[i].compare_exchange_strong(expected, kWriting, std::memory_order_acquire)) {
      std::memcpy(g_paths[i], path, len + 1);
      g_state[i].store(ready_state, std::memory_order_release);
      return i;
    }
  }
  return -1;
}
}  // namespace

int register_temp_file(const char* path) noexcept { return register_path(path, kReady); }

int register_temp_dir(const char* path) noexcept { return register_path(path, kReadyDir); }

void unregister_temp_file(int slot) noexcept {
  if (slot < 0 || slot >= kMaxTempFiles) return;
  g_state[slot].store(kFree, std::memory_order_release);
}

int registered_temp_file_count() noexcept {
  int n = 0;
  for (int i = 0; i < kMaxTempFiles; ++i) {
    const int st = g_state[i].load(std::memory_order_acquire);
    n += st == kReady || st == kReadyDir;
  }
  return n;
}

void install_interrupt_handlers(const char* tool_name) noexcept {
  if (tool_name) {
    // Written before the handlers exist (first call) or while they may run (later calls: a torn
    // name is harmless, it is always NUL-terminated at the buffer's end).
    std::strncpy(g_tool, tool_name, sizeof g_tool - 1);
    g_tool[sizeof g_tool - 1] = '\0';
  }
  for (int signo : {SIGINT, SIGTERM}) {
    struct sigaction old {};
    if (::sigaction(signo, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sa.sa_flags = 0;
    ::sigaction(signo, &sa, nullptr);
  }
}

}  // namespace sq
