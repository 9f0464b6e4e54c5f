/* UCX's log on stderr: a handler on top of UCX's stack of log handlers.
 *
 * UCX prints its warnings and errors to stdout unless UCX_LOG_FILE says otherwise, and libucs
 * reads that variable when it loads, before the program's main. A program whose stdout is a
 * document (rdma-bench --json) pushes this handler instead: it writes each line of the
 * message as `file:line UCX  WARN  text` to stderr (or to stdout while the doctor captures
 * UCX's words there), and stops UCX's default handler from printing it again.
 *
 * FATAL is left to UCX's default handler: it prints the message and aborts the process
 * (UCX_LOG_LEVEL_TRIGGER), which UCX relies on where it cannot go on.
 *
 * A handler is written in C because it receives a va_list, which stable Rust cannot take. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <ucs/debug/log_def.h>

static int rs_ucx_log_stdout; /* 0: stderr, 1: stdout; read and written atomically */

static ucs_log_func_rc_t rs_ucx_log(const char *file, unsigned line, const char *function,
                                    ucs_log_level_t level,
                                    const ucs_log_component_config_t *comp_conf,
                                    const char *message, va_list ap)
{
    char text[1024];
    char *rest, *one;
    const char *base = strrchr(file, '/');
    /* UCS_LOG_LEVEL_PRINT comes after UCS_LOG_LEVEL_LAST, where the table may end. */
    const char *name = level < UCS_LOG_LEVEL_LAST ? ucs_log_level_names[level] : "PRINT";
    FILE *f = __atomic_load_n(&rs_ucx_log_stdout, __ATOMIC_ACQUIRE) ? stdout : stderr;

    (void)function;
    (void)comp_conf;
    if (level == UCS_LOG_LEVEL_FATAL) {
        return UCS_LOG_FUNC_RC_CONTINUE;
    }
    vsnprintf(text, sizeof(text), message, ap);
    /* Each line with the prefix, as UCX's own handler writes a message of several. */
    for (one = strtok_r(text, "\n", &rest); one != NULL; one = strtok_r(NULL, "\n", &rest)) {
        fprintf(f, "%s:%u UCX  %-5s %s\n", base ? base + 1 : file, line, name ? name : "LOG",
                one);
    }
    fflush(f);
    return UCS_LOG_FUNC_RC_STOP;
}

/* Push the handler: once per process, before the program's first UCP context (pushing is
 * not thread-safe; UCX's own threads rarely log that early). */
void rs_ucx_log_push(void)
{
    ucs_log_push_handler(rs_ucx_log);
}

/* Where the handler writes: stdout when to_stdout, else stderr. */
void rs_ucx_log_stream(int to_stdout)
{
    __atomic_store_n(&rs_ucx_log_stdout, to_stdout != 0, __ATOMIC_RELEASE);
}
