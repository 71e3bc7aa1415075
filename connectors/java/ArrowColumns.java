package txstream.spark;

import java.io.ByteArrayOutputStream;
import java.nio.channels.Channels;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BaseFixedWidthVector;
import org.apache.arrow.vector.BaseVariableWidthVector;
import org.apache.arrow.vector.BitVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.Float4Vector;
import org.apache.arrow.vector.Float8Vector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.VectorUnloader;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.util.ArrowUtils;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.TaskCompletionListener;
import scala.reflect.ClassTag$;

/**
 * Parquet scans' columnar batches as the serialized Arrow record batches that Spark's
 * {@code Dataset.toArrowBatchRdd} makes (one {@code MessageSerializer} record batch message
 * per element, at most {@code maxRows} rows each), copied column by column instead of row by
 * row through whole-stage code and {@code ArrowWriter}. The last output column is each row's
 * input position: the file's base plus the row index the scan reads as a column.
 *
 * <p>Plain Java without lambdas or generics, so that Janino compiles it as well as javac.
 */
public final class ArrowColumns implements FlatMapFunction {
  private static final long serialVersionUID = 1L;

  private final String schemaJson;
  private final int[] columns;
  private final int rowIndex;
  private final long base;
  private final int maxRows;

  /** The driver's entry point (made by reflection, then called through Py4J). */
  public ArrowColumns() {
    this(null, null, -1, 0L, 0);
  }

  private ArrowColumns(String schemaJson, int[] columns, int rowIndex, long base, int maxRows) {
    this.schemaJson = schemaJson;
    this.columns = columns;
    this.rowIndex = rowIndex;
    this.base = base;
    this.maxRows = maxRows;
  }

  /**
   * One RDD of Arrow batches over the scans of several files, in file order: file {@code i}'s
   * positions are {@code i << shift} plus its row index. In every scan, {@code columns} are the
   * ordinals of the schema's columns but the last, {@code rowIndex} that of the row index.
   */
  public RDD files(
      List scans, String schemaJson, int[] columns, int rowIndex, int shift, int maxRows) {
    JavaRDD[] converted = new JavaRDD[scans.size()];
    for (int i = 0; i < converted.length; i++) {
      RDD scan = (RDD) scans.get(i);
      JavaRDD batches = new JavaRDD(scan, ClassTag$.MODULE$.apply(ColumnarBatch.class));
      ArrowColumns file =
          new ArrowColumns(schemaJson, columns, rowIndex, ((long) i) << shift, maxRows);
      converted[i] = batches.mapPartitions(file);
    }
    if (converted.length == 1) {
      return converted[0].rdd();
    }
    return JavaSparkContext.fromSparkContext(converted[0].context()).union(converted).rdd();
  }

  @Override
  public Iterator call(Object batches) {
    return new Batches(this, (Iterator) batches);
  }

  /** A task's output: its columnar batches, copied into one reused set of Arrow vectors. */
  private static final class Batches implements Iterator, TaskCompletionListener {
    private final ArrowColumns spec;
    private final Iterator input;
    private final BufferAllocator allocator;
    private final VectorSchemaRoot root;
    private final FieldVector[] vectors;
    private ColumnarBatch pending;
    private int pendingFrom;
    private boolean closed;

    Batches(ArrowColumns spec, Iterator input) {
      this.spec = spec;
      this.input = input;
      allocator =
          ArrowUtils.rootAllocator().newChildAllocator("txstream columns", 0, Long.MAX_VALUE);
      try {
        root = VectorSchemaRoot.create(Schema.fromJSON(spec.schemaJson), allocator);
      } catch (java.io.IOException e) {
        allocator.close();
        throw new IllegalArgumentException("not an Arrow schema: " + spec.schemaJson, e);
      }
      List fields = root.getFieldVectors();
      vectors = new FieldVector[fields.size()];
      for (int i = 0; i < vectors.length; i++) {
        vectors[i] = (FieldVector) fields.get(i);
        allocate(vectors[i], spec.maxRows);
      }
      TaskContext context = TaskContext.get();
      if (context != null) {
        context.addTaskCompletionListener(this);
      }
    }

    public boolean hasNext() {
      if (closed) {
        return false;
      }
      if (!advance()) {
        close();
        return false;
      }
      return true;
    }

    /**
     * Whether an input row is left to copy (the next input batch taken if needed). The scan
     * reuses one batch: asking it for the next one overwrites (or empties) the current one.
     */
    private boolean advance() {
      while (pending == null || pendingFrom == pending.numRows()) {
        pending = null;
        if (!input.hasNext()) {
          return false;
        }
        pending = (ColumnarBatch) input.next();
        pendingFrom = 0;
      }
      return true;
    }

    public Object next() {
      if (!hasNext()) {
        throw new NoSuchElementException();
      }
      for (int i = 0; i < vectors.length; i++) {
        vectors[i].reset(); // zeroed, capacity kept
      }
      int rows = 0;
      while (rows < spec.maxRows && advance()) {
        int count = Math.min(spec.maxRows - rows, pending.numRows() - pendingFrom);
        copy(pending, pendingFrom, rows, count);
        pendingFrom += count;
        rows += count;
      }
      root.setRowCount(rows);
      return serialize();
    }

    private void copy(ColumnarBatch batch, int from, int to, int count) {
      int last = vectors.length - 1;
      for (int i = 0; i < last; i++) {
        copyColumn(batch.column(spec.columns[i]), from, vectors[i], to, count);
      }
      positions(batch.column(spec.rowIndex), from, vectors[last], to, count, spec.base);
    }

    private byte[] serialize() {
      VectorUnloader unloader = new VectorUnloader(root);
      ArrowRecordBatch batch = unloader.getRecordBatch();
      try {
        ByteArrayOutputStream out = new ByteArrayOutputStream((int) batch.computeBodyLength() + 4096);
        MessageSerializer.serialize(new WriteChannel(Channels.newChannel(out)), batch);
        return out.toByteArray();
      } catch (java.io.IOException e) {
        throw new RuntimeException(e);
      } finally {
        batch.close();
      }
    }

    public void onTaskCompletion(TaskContext context) {
      close();
    }

    private void close() {
      if (!closed) {
        closed = true;
        root.close();
        allocator.close();
      }
    }
  }

  private static void allocate(FieldVector vector, int rows) {
    if (vector instanceof BaseFixedWidthVector) {
      ((BaseFixedWidthVector) vector).allocateNew(rows);
    } else if (vector instanceof BaseVariableWidthVector) {
      ((BaseVariableWidthVector) vector).allocateNew(rows);
    } else {
      throw new IllegalArgumentException("no columnar copy into " + vector.getClass().getName());
    }
  }

  /** Rows {@code from..from+count} of a Spark column into rows {@code to..} of an Arrow one. */
  private static void copyColumn(ColumnVector source, int from, FieldVector target, int to, int count) {
    if (target instanceof BitVector) {
      copyBooleans(source, from, (BitVector) target, to, count);
    } else if (target instanceof VarCharVector) {
      copyStrings(source, from, (VarCharVector) target, to, count);
    } else if (target instanceof BaseVariableWidthVector) {
      copyBinaries(source, from, (BaseVariableWidthVector) target, to, count);
    } else {
      BaseFixedWidthVector fixed = (BaseFixedWidthVector) target;
      int width = fixed.getTypeWidth();
      if (target instanceof Float8Vector) {
        copyDoubles(source, from, fixed, to, count);
      } else if (target instanceof Float4Vector) {
        copyFloats(source, from, fixed, to, count);
      } else if (width == 8) {
        copyLongs(source, from, fixed, to, count);
      } else if (width == 4) {
        copyInts(source, from, fixed, to, count);
      } else if (width == 2) {
        copyShorts(source, from, fixed, to, count);
      } else if (width == 1) {
        copyBytes(source, from, fixed, to, count);
      } else {
        throw new IllegalArgumentException("no columnar copy into " + target.getClass().getName());
      }
    }
  }

  /** Set the validity of rows {@code to..to+count}: from the source's nulls, if it has any. */
  private static boolean validity(ColumnVector source, int from, FieldVector target, int to, int count) {
    if (!source.hasNull()) {
      allValid(target, to, count);
      return false;
    }
    long address = target.getValidityBuffer().memoryAddress();
    for (int i = 0; i < count; i++) {
      if (!source.isNullAt(from + i)) {
        setBit(address, to + i);
      }
    }
    return true;
  }

  /** Rows {@code to..to+count} valid: whole bytes at once, bit by bit only at the ends. */
  private static void allValid(FieldVector target, int to, int count) {
    long address = target.getValidityBuffer().memoryAddress();
    int end = to + count;
    int head = Math.min(end, (to + 7) & ~7);
    int tail = Math.max(head, end & ~7);
    for (int row = to; row < head; row++) {
      setBit(address, row);
    }
    Platform.setMemory(address + (head >> 3), (byte) 0xff, (tail - head) >> 3);
    for (int row = tail; row < end; row++) {
      setBit(address, row);
    }
  }

  private static void setBit(long address, int row) {
    long at = address + (row >> 3);
    Platform.putByte(null, at, (byte) (Platform.getByte(null, at) | (1 << (row & 7))));
  }

  /**
   * Positions from the scan's row index: never null (the scan may still say its column has
   * nulls, the mark of a column missing from the file, which the row index is).
   */
  private static void positions(
      ColumnVector source, int from, FieldVector target, int to, int count, long base) {
    allValid(target, to, count);
    long address = target.getDataBuffer().memoryAddress() + 8L * to;
    for (int i = 0; i < count; i++) {
      Platform.putLong(null, address + 8L * i, base + source.getLong(from + i));
    }
  }

  private static void copyLongs(ColumnVector source, int from, FieldVector target, int to, int count) {
    boolean nulls = validity(source, from, target, to, count);
    long address = target.getDataBuffer().memoryAddress() + 8L * to;
    for (int i = 0; i < count; i++) {
      if (!nulls || !source.isNullAt(from + i)) {
        Platform.putLong(null, address + 8L * i, source.getLong(from + i));
      }
    }
  }

  private static void copyDoubles(ColumnVector source, int from, FieldVector target, int to, int count) {
    boolean nulls = validity(source, from, target, to, count);
    long address = target.getDataBuffer().memoryAddress() + 8L * to;
    for (int i = 0; i < count; i++) {
      if (!nulls || !source.isNullAt(from + i)) {
        Platform.putDouble(null, address + 8L * i, source.getDouble(from + i));
      }
    }
  }

  private static void copyInts(ColumnVector source, int from, FieldVector target, int to, int count) {
    boolean nulls = validity(source, from, target, to, count);
    long address = target.getDataBuffer().memoryAddress() + 4L * to;
    for (int i = 0; i < count; i++) {
      if (!nulls || !source.isNullAt(from + i)) {
        Platform.putInt(null, address + 4L * i, source.getInt(from + i));
      }
    }
  }

  private static void copyFloats(ColumnVector source, int from, FieldVector target, int to, int count) {
    boolean nulls = validity(source, from, target, to, count);
    long address = target.getDataBuffer().memoryAddress() + 4L * to;
    for (int i = 0; i < count; i++) {
      if (!nulls || !source.isNullAt(from + i)) {
        Platform.putFloat(null, address + 4L * i, source.getFloat(from + i));
      }
    }
  }

  private static void copyShorts(ColumnVector source, int from, FieldVector target, int to, int count) {
    boolean nulls = validity(source, from, target, to, count);
    long address = target.getDataBuffer().memoryAddress() + 2L * to;
    for (int i = 0; i < count; i++) {
      if (!nulls || !source.isNullAt(from + i)) {
        Platform.putShort(null, address + 2L * i, source.getShort(from + i));
      }
    }
  }

  private static void copyBytes(ColumnVector source, int from, FieldVector target, int to, int count) {
    boolean nulls = validity(source, from, target, to, count);
    long address = target.getDataBuffer().memoryAddress() + to;
    for (int i = 0; i < count; i++) {
      if (!nulls || !source.isNullAt(from + i)) {
        Platform.putByte(null, address + i, source.getByte(from + i));
      }
    }
  }

  private static void copyBooleans(ColumnVector source, int from, BitVector target, int to, int count) {
    boolean nulls = validity(source, from, target, to, count);
    long address = target.getDataBuffer().memoryAddress();
    for (int i = 0; i < count; i++) {
      if ((!nulls || !source.isNullAt(from + i)) && source.getBoolean(from + i)) {
        setBit(address, to + i);
      }
    }
  }

  private static void copyStrings(ColumnVector source, int from, VarCharVector target, int to, int count) {
    for (int i = 0; i < count; i++) {
      if (source.isNullAt(from + i)) {
        target.setNull(to + i);
      } else {
        UTF8String value = source.getUTF8String(from + i);
        Object bytes = value.getBaseObject();
        if (bytes instanceof byte[]) {
          int offset = (int) (value.getBaseOffset() - Platform.BYTE_ARRAY_OFFSET);
          target.setSafe(to + i, (byte[]) bytes, offset, value.numBytes());
        } else {
          target.setSafe(to + i, value.getBytes());
        }
      }
    }
  }

  private static void copyBinaries(
      ColumnVector source, int from, BaseVariableWidthVector target, int to, int count) {
    for (int i = 0; i < count; i++) {
      if (source.isNullAt(from + i)) {
        target.setNull(to + i);
      } else {
        byte[] value = source.getBinary(from + i);
        target.setSafe(to + i, value, 0, value.length);
      }
    }
  }
}
