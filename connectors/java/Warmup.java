package txstream.spark;

import java.io.File;
import java.lang.instrument.Instrumentation;

import org.slf4j.LoggerFactory;

/**
 * The executor's warm-up, as a Java agent ({@code -javaagent:<this jar>=<sample.parquet>}):
 * while the executor's JVM starts and registers with Spark's driver (over a second, much of
 * it waiting), a thread of its own converts a sample Parquet file as a task converts its
 * split ({@link ArrowColumns#warm}), at the lowest priority. The first tasks then find the
 * reader's, Hadoop's and Arrow's classes loaded and initialised and their code compiled,
 * instead of doing that on the way to the first event (a cold task takes about twice as long
 * as a warm one). A failure only costs the warm-up: one line on stderr (the executor's log).
 *
 * <p>Plain Java without lambdas or generics, so that Janino compiles it as well as javac.
 */
public final class Warmup implements Runnable {
  /** Rows per converted batch: Spark's default {@code arrow.maxRecordsPerBatch}. */
  private static final int BATCH_ROWS = 10000;

  private final String sample;

  private Warmup(String sample) {
    this.sample = sample;
  }

  /** The agent's entry point: start the warm-up and return at once. */
  public static void premain(String sample, Instrumentation instrumentation) {
    Thread thread = new Thread(new Warmup(sample), "txstream warm-up");
    thread.setDaemon(true); // never holds the executor's exit
    thread.start();
  }

  public void run() {
    idle();
    long begin = System.nanoTime();
    try {
      long rows = ArrowColumns.warm(sample, BATCH_ROWS);
      long ms = (System.nanoTime() - begin) / 1000000;
      LoggerFactory.getLogger(Warmup.class).info("warmed up: " + rows + " rows in " + ms + " ms");
    } catch (Throwable e) {
      System.err.println("txstream: Spark executor's warm-up on " + sample + " failed: " + e);
    }
  }

  /**
   * This thread at the lowest priority (nice 19, Linux's {@code renice} on its thread id): it
   * takes only cores that nothing else wants, not the driver's while it plans the input. Where
   * that fails, the warm-up runs at the JVM's priority.
   */
  private static void idle() {
    try {
      String thread = new File("/proc/thread-self").getCanonicalFile().getName();
      new ProcessBuilder("renice", "-n", "19", "-p", thread)
          .redirectOutput(ProcessBuilder.Redirect.DISCARD)
          .redirectError(ProcessBuilder.Redirect.DISCARD)
          .start()
          .waitFor();
    } catch (Exception e) {
      // not Linux, or no renice
    }
  }

  /** Warm up in the foreground and say how many rows were converted (for the tests). */
  public static void main(String[] args) throws Exception {
    System.out.println(ArrowColumns.warm(args[0], BATCH_ROWS) + " rows");
  }
}
