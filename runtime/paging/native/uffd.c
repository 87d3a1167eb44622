/* userfaultfd set-up shared by the driver (write-protect) and workers (missing + minor). */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pager_common.h"

int cl_uffd_open(uint64_t features, char *err, size_t errlen) {
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return CL_ERR("userfaultfd is not available (%s); clamor needs Linux >= 5.19 and "
                      "CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1", strerror(errno));
    struct uffdio_api api = {.api = UFFD_API, .features = features};
    if (ioctl(fd, UFFDIO_API, &api)) {
        close(fd);
        return CL_ERR("userfaultfd lacks features 0x%llx (%s)", (unsigned long long)features,
                      strerror(errno));
    }
    return fd;
}

int cl_uffd_register(int uffd, void *base, uint64_t len, uint64_t mode, char *err, size_t errlen) {
    struct uffdio_register r = {.range = {(uint64_t)(uintptr_t)base, len}, .mode = mode};
    if (ioctl(uffd, UFFDIO_REGISTER, &r))
        return CL_ERR("userfaultfd register failed: %s", strerror(errno));
    return 0;
}
