package txstream.spark;

import java.io.ByteArrayOutputStream;
import java.lang.reflect.Field;
import java.net.URI;
import java.nio.channels.Channels;
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
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.format.converter.ParquetMetadataConverter;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.deploy.SparkHadoopUtil;
import org.apache.spark.rdd.InputFileBlockHolder;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.execution.datasources.parquet.ParquetDictionary;
import org.apache.spark.sql.execution.vectorized.Dictionary;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
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
 * input position: the file's base plus its row index in the file, counted from the first row
 * of the row groups the scan's split holds ({@link Split}).
 *
 * <p>Plain Java without lambdas or generics, so that Janino compiles it as well as javac.
 */
public final class ArrowColumns implements FlatMapFunction {
  private static final long serialVersionUID = 1L;

  private final String schemaJson;
  private final int[] columns;
  private final long base;
  private final int maxRows;

  /** The driver's entry point (made by reflection, then called through Py4J). */
  public ArrowColumns() {
    this(null, null, 0L, 0);
  }

  private ArrowColumns(String schemaJson, int[] columns, long base, int maxRows) {
    this.schemaJson = schemaJson;
    this.columns = columns;
    this.base = base;
    this.maxRows = maxRows;
  }

  /**
   * One RDD of Arrow batches over the scans of several files, in file order: file {@code i}'s
   * positions are {@code i << shift} plus its row index. In every scan, {@code columns} are the
   * ordinals of the schema's columns but the last (the position).
   */
  public RDD files(List scans, String schemaJson, int[] columns, int shift, int maxRows) {
    JavaRDD[] converted = new JavaRDD[scans.size()];
    for (int i = 0; i < converted.length; i++) {
      RDD scan = (RDD) scans.get(i);
      JavaRDD batches = new JavaRDD(scan, ClassTag$.MODULE$.apply(ColumnarBatch.class));
      ArrowColumns file =
          new ArrowColumns(schemaJson, columns, ((long) i) << shift, maxRows);
      converted[i] = batches.mapPartitions(file);
    }
    if (converted.length == 1) {
      return converted[0].rdd();
    }
    return JavaSparkContext.fromSparkContext(converted[0].context()).union(converted).rdd();
  }

  @Override
  public Iterator call(Object batches) {
    return new Batches(this, (Iterator) batches, hadoopConfiguration());
  }

  /** A task's output: its columnar batches, copied into one reused set of Arrow vectors. */
  private static final class Batches implements Iterator, TaskCompletionListener {
    private final ArrowColumns spec;
    private final Iterator input;
    private final BufferAllocator allocator;
    private final VectorSchemaRoot root;
    private final FieldVector[] vectors;
    private final Decoded[] decoded;
    private final Split split = new Split();
    private final Configuration conf;
    private ColumnarBatch pending;
    private int pendingFrom;
    private boolean closed;

    Batches(ArrowColumns spec, Iterator input, Configuration conf) {
      this.spec = spec;
      this.input = input;
      this.conf = conf;
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
      decoded = new Decoded[vectors.length - 1];
      for (int i = 0; i < decoded.length; i++) {
        decoded[i] = new Decoded();
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
          split.leave();
          return false;
        }
        pending = (ColumnarBatch) input.next();
        pendingFrom = 0;
        split.enter(conf);
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
        copyColumn(batch.column(spec.columns[i]), from, vectors[i], to, count, decoded[i]);
      }
      split.positions(vectors[last], to, count, spec.base);
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
  private static void copyColumn(
      ColumnVector source, int from, FieldVector target, int to, int count, Decoded decoded) {
    if (target instanceof BitVector) {
      copyBooleans(source, from, (BitVector) target, to, count);
    } else if (target instanceof BaseVariableWidthVector) {
      copyBinaries(source, from, (BaseVariableWidthVector) target, to, count, decoded);
    } else {
      int width = ((BaseFixedWidthVector) target).getTypeWidth();
      validity(source, from, target, to, count);
      long address = target.getDataBuffer().memoryAddress() + (long) width * to;
      if (target instanceof Float8Vector) {
        copyEights(source, from, address, count, decoded, DOUBLES);
      } else if (target instanceof Float4Vector) {
        copyFours(source, from, address, count, decoded, FLOATS);
      } else if (width == 8) {
        copyEights(source, from, address, count, decoded, LONGS);
      } else if (width == 4) {
        copyFours(source, from, address, count, decoded, INTS);
      } else if (width == 2) {
        copyBulk(source.getShorts(from, count), Platform.SHORT_ARRAY_OFFSET, address, 2L * count);
      } else if (width == 1) {
        copyBulk(source.getBytes(from, count), Platform.BYTE_ARRAY_OFFSET, address, count);
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
   * The file split a task's scan reads now (Spark's {@code InputFileBlockHolder}, which the
   * scan sets as it opens each split) and how far into its rows it is. Its row groups and
   * their first rows' indexes in the file come from the file's footer, filtered to the split
   * as Spark's Parquet reader filters it (parquet-mr's {@code range}): the scan reads them in
   * order, whole. Spark's own row index column ({@code _metadata.row_index}) gives the same
   * numbers but makes each one through a boxed Scala range, a fifth of a task's time. A split
   * whose rows do not add up to its row groups' fails the task.
   */
  private static final class Split {
    private String path;
    private long start = -1;
    private long length = -1;
    private long[] firstRows = new long[0];
    private long[] rows = new long[0];
    private int group;
    private long inGroup;

    /** Take the split of the batch just read, if it is a new one (its footer read with conf). */
    void enter(Configuration conf) {
      String now = InputFileBlockHolder.getInputFilePath().toString();
      long nowStart = InputFileBlockHolder.getStartOffset();
      long nowLength = InputFileBlockHolder.getLength();
      if (nowStart == start && nowLength == length && now.equals(path)) {
        return;
      }
      leave();
      List blocks = footer(conf, now, nowStart, nowLength);
      firstRows = new long[blocks.size()];
      rows = new long[blocks.size()];
      for (int i = 0; i < rows.length; i++) {
        BlockMetaData block = (BlockMetaData) blocks.get(i);
        firstRows[i] = block.getRowIndexOffset();
        rows[i] = block.getRowCount();
      }
      path = now;
      start = nowStart;
      length = nowLength;
      group = 0;
      inGroup = 0;
    }

    /** Check that the split's rows were read to the last. */
    void leave() {
      long left = 0;
      for (int i = group; i < rows.length; i++) {
        left += rows[i] - (i == group ? inGroup : 0);
      }
      if (left != 0) {
        throw new IllegalStateException(where() + ": " + left + " rows of its row groups not read");
      }
    }

    /** The next {@code count} rows' positions into rows {@code to..} of {@code target}. */
    void positions(FieldVector target, int to, int count, long base) {
      allValid(target, to, count);
      long address = target.getDataBuffer().memoryAddress() + 8L * to;
      for (int i = 0; i < count; i++) {
        while (group < rows.length && inGroup == rows[group]) {
          group++;
          inGroup = 0;
        }
        if (group == rows.length) {
          throw new IllegalStateException(where() + ": more rows than its row groups hold");
        }
        Platform.putLong(null, address + 8L * i, base + firstRows[group] + inGroup);
        inGroup++;
      }
    }

    private String where() {
      return "the split of " + path + " at byte " + start + " (" + length + " bytes)";
    }
  }

  private static Configuration hadoop;

  /** The row groups of a file's split (its footer's, as Spark's reader keeps them). */
  private static List footer(Configuration conf, String urlPath, long start, long length) {
    try {
      Path path = new Path(new URI(urlPath));
      return ParquetFileReader.readFooter(
              conf, path, ParquetMetadataConverter.range(start, start + length))
          .getBlocks();
    } catch (Exception e) {
      throw new IllegalStateException("cannot read the Parquet footer of " + urlPath, e);
    }
  }

  /** The executor's Hadoop configuration (Spark's, with its {@code spark.hadoop.*}). */
  private static synchronized Configuration hadoopConfiguration() {
    if (hadoop == null) {
      hadoop = SparkHadoopUtil.get().newConfiguration(SparkEnv.get().conf());
    }
    return hadoop;
  }

  private static final int LONGS = 0;
  private static final int DOUBLES = 1;
  private static final int INTS = 2;
  private static final int FLOATS = 3;
  private static final int BINARIES = 4;

  /**
   * 8-byte values (longs and timestamps, or doubles) to {@code address}: through the decoded
   * dictionary if the rows are dictionary ids, else the column's array copied in one go. A
   * null row's bytes are left unspecified, as Arrow allows (its validity bit is clear).
   */
  private static void copyEights(
      ColumnVector source, int from, long address, int count, Decoded decoded, int type) {
    long[] dictionary = (long[]) decoded.values(source, type);
    if (dictionary != null) {
      int[] ids = ((WritableColumnVector) source).getDictionaryIds().getInts(from, count);
      for (int i = 0; i < count; i++) {
        int id = ids[i];
        if (id < dictionary.length) { // a null row's id is whatever the vector held
          Platform.putLong(null, address + 8L * i, dictionary[id]);
        }
      }
    } else if (type == DOUBLES) {
      copyBulk(source.getDoubles(from, count), Platform.DOUBLE_ARRAY_OFFSET, address, 8L * count);
    } else {
      copyBulk(source.getLongs(from, count), Platform.LONG_ARRAY_OFFSET, address, 8L * count);
    }
  }

  /** 4-byte values (ints and dates, or floats), as {@link #copyEights}. */
  private static void copyFours(
      ColumnVector source, int from, long address, int count, Decoded decoded, int type) {
    int[] dictionary = (int[]) decoded.values(source, type);
    if (dictionary != null) {
      int[] ids = ((WritableColumnVector) source).getDictionaryIds().getInts(from, count);
      for (int i = 0; i < count; i++) {
        int id = ids[i];
        if (id < dictionary.length) {
          Platform.putInt(null, address + 4L * i, dictionary[id]);
        }
      }
    } else if (type == FLOATS) {
      copyBulk(source.getFloats(from, count), Platform.FLOAT_ARRAY_OFFSET, address, 4L * count);
    } else {
      copyBulk(source.getInts(from, count), Platform.INT_ARRAY_OFFSET, address, 4L * count);
    }
  }

  private static void copyBulk(Object values, long offset, long address, long bytes) {
    Platform.copyMemory(values, offset, null, address, bytes);
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

  /** Strings and binaries: through the decoded dictionary if the rows are dictionary ids. */
  private static void copyBinaries(
      ColumnVector source, int from, BaseVariableWidthVector target, int to, int count, Decoded decoded) {
    byte[][] dictionary = (byte[][]) decoded.values(source, BINARIES);
    int[] ids =
        dictionary == null
            ? null
            : ((WritableColumnVector) source).getDictionaryIds().getInts(from, count);
    boolean strings = target instanceof VarCharVector;
    for (int i = 0; i < count; i++) {
      if (source.isNullAt(from + i)) {
        target.setNull(to + i);
      } else if (ids != null) {
        byte[] value = dictionary[ids[i]];
        target.setSafe(to + i, value, 0, value.length);
      } else if (strings) {
        UTF8String value = source.getUTF8String(from + i);
        Object bytes = value.getBaseObject();
        if (bytes instanceof byte[]) {
          int offset = (int) (value.getBaseOffset() - Platform.BYTE_ARRAY_OFFSET);
          target.setSafe(to + i, (byte[]) bytes, offset, value.numBytes());
        } else {
          target.setSafe(to + i, value.getBytes());
        }
      } else {
        byte[] value = source.getBinary(from + i);
        target.setSafe(to + i, value, 0, value.length);
      }
    }
  }

  private static final Field SPARK_DICTIONARY = field(WritableColumnVector.class, "dictionary");
  private static final Field PARQUET_DICTIONARY = field(ParquetDictionary.class, "dictionary");

  /** A private field made readable; null if this Spark has no such field. */
  private static Field field(Class owner, String name) {
    try {
      Field found = owner.getDeclaredField(name);
      found.setAccessible(true);
      return found;
    } catch (Exception e) { // another Spark: values decoded row by row, as Spark does
      return null;
    }
  }

  /**
   * One output column's Parquet dictionary, decoded once per column chunk. Spark's scan
   * leaves a dictionary-encoded page's values as dictionary ids and decodes them row by row,
   * through two dictionaries' calls per value: most of a copy's time. Spark wraps the chunk's
   * Parquet dictionary anew in every batch, so the decoded values are kept by the identity
   * of the Parquet dictionary inside (a private field: Spark has no accessor).
   */
  private static final class Decoded {
    private Object chunk;
    private Object values;

    /**
     * The decoded dictionary of {@code source} in this batch, as {@code long[]} (LONGS, and
     * DOUBLES' bits), {@code int[]} (INTS, FLOATS' bits) or {@code byte[][]} (BINARIES); null
     * if its rows are values, not dictionary ids.
     */
    Object values(ColumnVector source, int type) {
      if (SPARK_DICTIONARY == null || PARQUET_DICTIONARY == null) {
        return null;
      }
      if (!(source instanceof WritableColumnVector)
          || !((WritableColumnVector) source).hasDictionary()) {
        return null;
      }
      Object parquet;
      Dictionary dictionary;
      try {
        Object wrapped = SPARK_DICTIONARY.get(source);
        if (!(wrapped instanceof ParquetDictionary)) {
          return null;
        }
        dictionary = (Dictionary) wrapped;
        parquet = PARQUET_DICTIONARY.get(wrapped);
      } catch (IllegalAccessException e) {
        return null;
      }
      if (parquet != chunk) {
        values = decode(dictionary, ((org.apache.parquet.column.Dictionary) parquet).getMaxId() + 1, type);
        chunk = parquet;
      }
      return values;
    }

    private static Object decode(Dictionary dictionary, int size, int type) {
      if (type == LONGS || type == DOUBLES) {
        long[] values = new long[size];
        for (int id = 0; id < size; id++) {
          values[id] =
              type == LONGS
                  ? dictionary.decodeToLong(id)
                  : Double.doubleToRawLongBits(dictionary.decodeToDouble(id));
        }
        return values;
      }
      if (type == INTS || type == FLOATS) {
        int[] values = new int[size];
        for (int id = 0; id < size; id++) {
          values[id] =
              type == INTS
                  ? dictionary.decodeToInt(id)
                  : Float.floatToRawIntBits(dictionary.decodeToFloat(id));
        }
        return values;
      }
      byte[][] values = new byte[size][];
      for (int id = 0; id < size; id++) {
        values[id] = dictionary.decodeToBinary(id);
      }
      return values;
    }
  }
}
