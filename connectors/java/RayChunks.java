package txstream.spark;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.channels.Channels;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Optional;

import io.ray.api.ObjectRef;
import io.ray.api.PyActorHandle;
import io.ray.api.Ray;
import io.ray.api.call.PyActorTaskCaller;
import io.ray.api.function.PyActorMethod;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.IpcOption;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.function.FlatMapFunction;

/**
 * Hands each task's serialized Arrow record batches (what {@code toArrowBatchRdd} or {@link
 * ArrowColumns} make) to txstream's partition fetcher, a Python actor of the same Ray job, as
 * they are made: every {@code batchesPerChunk} batches become one Arrow IPC stream. A task on
 * the fetcher's node writes the stream into a file of its temporary folder and calls {@code
 * stored_file(source, partition, chunk, path)} (the fetcher keeps the file, which readers on
 * its node map); a task elsewhere sends it as the argument of {@code stored(source,
 * partition, chunk, stream)}, which costs three more copies of it on the way. The task ends
 * with {@code ended(source, partition, chunks)} once every call has returned. The consumer
 * reads a partition's first chunk while Spark converts the rest, and no converted batch goes
 * through Spark's block manager (written to disk, read back, copied into one array per
 * partition). The task's one output row is its number of chunks.
 *
 * <p>Plain Java without lambdas or generics, so that Janino compiles it as well as javac.
 */
public final class RayChunks implements FlatMapFunction {
  private static final long serialVersionUID = 1L;

  private final String fetcher;
  private final String fetcherNode;
  private final String source;
  private final String schemaJson;
  private final int batchesPerChunk;

  /** The driver's entry point (made by reflection, then called through Py4J). */
  public RayChunks() {
    this(null, null, null, null, 1);
  }

  private RayChunks(
      String fetcher, String fetcherNode, String source, String schemaJson, int batchesPerChunk) {
    this.fetcher = fetcher;
    this.fetcherNode = fetcherNode;
    this.source = source;
    this.schemaJson = schemaJson;
    this.batchesPerChunk = batchesPerChunk;
  }

  /**
   * {@code batches} (serialized record batches of schema {@code schemaJson}) delivered to the
   * actor named {@code fetcher}, which runs on the Ray node {@code fetcherNode} (its id in
   * hex), as the chunks of {@code source}, when the result is computed.
   */
  public JavaRDD deliver(
      JavaRDD batches,
      String fetcher,
      String fetcherNode,
      String source,
      String schemaJson,
      int batchesPerChunk) {
    return batches.mapPartitions(
        new RayChunks(fetcher, fetcherNode, source, schemaJson, Math.max(1, batchesPerChunk)));
  }

  @Override
  public Iterator call(Object input) throws IOException {
    Iterator batches = (Iterator) input;
    int partition = TaskContext.getPartitionId();
    Optional found = Ray.getActor(fetcher);
    if (!found.isPresent()) {
      throw new IllegalStateException("no actor " + fetcher + " in this Ray job");
    }
    PyActorHandle actor = (PyActorHandle) found.get();
    byte[] schema = schemaMessage();
    byte[] end = endOfStream();
    boolean besideFetcher = Ray.getRuntimeContext().getCurrentNodeId().toString()
        .equals(fetcherNode);
    List pending = new ArrayList();
    ObjectRef inFlight = null;
    int chunk = 0;
    while (batches.hasNext()) {
      pending.add(batches.next());
      if (pending.size() == batchesPerChunk || !batches.hasNext()) {
        ObjectRef sent;
        if (besideFetcher) {
          String path = written(schema, pending, end);
          Object[] args = {source, Integer.valueOf(partition), Integer.valueOf(chunk), path};
          sent = call(actor, "stored_file", args);
        } else {
          byte[] stream = stream(schema, pending, end);
          Object[] args = {source, Integer.valueOf(partition), Integer.valueOf(chunk), stream};
          sent = call(actor, "stored", args);
        }
        pending.clear();
        chunk++;
        if (inFlight != null) {
          inFlight.get(); // one chunk in flight while the next is converted
        }
        inFlight = sent;
      }
    }
    if (inFlight != null) {
      inFlight.get();
    }
    Object[] args = {source, Integer.valueOf(partition), Integer.valueOf(chunk)};
    call(actor, "ended", args).get();
    return Collections.singletonList(Integer.valueOf(chunk)).iterator();
  }

  /**
   * A call of the Python actor's {@code method} (through the caller's constructor: Janino does
   * not resolve {@code PyActorHandle.task}, a default method overloaded by arity).
   */
  private static ObjectRef call(PyActorHandle actor, String method, Object[] args) {
    return new PyActorTaskCaller(actor, PyActorMethod.of(method), args).remote();
  }

  private byte[] schemaMessage() throws IOException {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    WriteChannel channel = new WriteChannel(Channels.newChannel(out));
    MessageSerializer.serialize(channel, Schema.fromJSON(schemaJson));
    return out.toByteArray();
  }

  private static byte[] endOfStream() throws IOException {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    WriteChannel channel = new WriteChannel(Channels.newChannel(out));
    ArrowStreamWriter.writeEndOfStream(channel, new IpcOption());
    return out.toByteArray();
  }

  /**
   * One IPC stream (as {@link #stream}) written into a new file of the folder that {@code
   * java.io.tmpdir} names now (RayDP points it at the executor's working folder, in the Ray
   * session's folder: a local Ray's is removed with it, also after a killed run); its path.
   * Its pages stay in the page cache until the kernel's writeback takes them (after 30 s by
   * default, or when memory runs short).
   */
  private static String written(byte[] schema, List batches, byte[] end) throws IOException {
    File folder = new File(System.getProperty("java.io.tmpdir"));
    File file = File.createTempFile("txstream-chunk-", ".arrows", folder);
    // appended to, not truncated: ext4 writes a file truncated to nothing back to disk as it
    // is closed (its auto_da_alloc heuristic), and the task's thread would wait for it
    FileOutputStream out = new FileOutputStream(file, true);
    boolean complete = false;
    try {
      out.write(schema);
      for (int i = 0; i < batches.size(); i++) {
        out.write((byte[]) batches.get(i));
      }
      out.write(end);
      out.close();
      complete = true;
    } finally {
      if (!complete) {
        out.close();
        file.delete();
      }
    }
    return file.getPath();
  }

  /** One IPC stream: the schema, the batches' messages as they are, the end of stream. */
  private static byte[] stream(byte[] schema, List batches, byte[] end) {
    long size = schema.length + end.length;
    for (int i = 0; i < batches.size(); i++) {
      size += ((byte[]) batches.get(i)).length;
    }
    if (size > Integer.MAX_VALUE - 16) {
      throw new IllegalStateException("a chunk of " + size + " bytes: fewer batches per chunk");
    }
    byte[] stream = new byte[(int) size];
    System.arraycopy(schema, 0, stream, 0, schema.length);
    int at = schema.length;
    for (int i = 0; i < batches.size(); i++) {
      byte[] batch = (byte[]) batches.get(i);
      System.arraycopy(batch, 0, stream, at, batch.length);
      at += batch.length;
    }
    System.arraycopy(end, 0, stream, at, end.length);
    return stream;
  }
}
