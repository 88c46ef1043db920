/* Run inside a VM: sends the host's Hira port bytes that are not a Hira frame, then
 * tries a port Hira does not serve, and reports how the host answered. */
#include <linux/vm_sockets.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int connect_port(unsigned port) {
    int s = socket(AF_VSOCK, SOCK_STREAM, 0);
    struct sockaddr_vm a;
    memset(&a, 0, sizeof a);
    a.svm_family = AF_VSOCK;
    a.svm_cid = VMADDR_CID_HOST;
    a.svm_port = port;
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        close(s);
        return -1;
    }
    return s;
}

int main(void) {
    int s = connect_port(5571);
    if (s < 0) {
        perror("connect to the Hira port");
        return 2;
    }
    unsigned char junk[64];
    memset(junk, 0xAB, sizeof junk);
    if (write(s, junk, sizeof junk) != (ssize_t)sizeof junk) return 2;
    unsigned char buf[256];
    ssize_t total = 0, n;
    while ((n = read(s, buf, sizeof buf)) > 0) total += n;
    printf("garbage: host answered %s, then closed\n", total > 0 ? "with an error frame" : "nothing");
    close(s);
    int t = connect_port(22);
    printf("port 22: %s\n", t < 0 ? "refused" : "accepted");
    return 0;
}
